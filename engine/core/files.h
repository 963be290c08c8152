// Whole files in and out, safely.
//
// Reading: opened without blocking (a FIFO with no writer reads as empty instead of hanging), the
// type checked first (a directory, a device such as /dev/zero, a socket are refused at once, by
// name), and read with a byte cap: a regular file's size is checked before it is read, a pipe is
// refused when it passes its (smaller) cap instead of filling memory. A name holding a NUL byte is
// refused (the system would read the file its first part names).
//
// Writing never replaces what is not a regular file, nor a regular file this process has read as
// an input (by device and inode: however the output spells it; core/file_roles.h refuses such
// outputs by role before a command runs, this is the backstop for files found later, such as an
// index's shards). A regular file (or a path that does not exist) is written atomically: a temporary
// file `.NAME.tmp-PID-N` in the same folder, written, fsync'ed, renamed over NAME; on SIGINT,
// SIGTERM or SIGHUP the temporary file is removed (core/temp_paths.h; SIGKILL cannot be caught: the
// next write to the same path removes temp files whose writer is gone). A symlink is followed and
// its target written that way; a device, FIFO or socket is written through (/dev/null, /dev/stdout). A write
// that fails (disk full, EIO) is a RuntimeError naming the file (exit 3); the target is never partial.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace ptool {

// max_bytes for a regular file, max_stream_bytes (at most max_bytes) for a pipe
std::string read_file(const std::string& path, size_t max_bytes, size_t max_stream_bytes = SIZE_MAX);

// InputError (exit 2) when `path` cannot be written: a directory, a regular file that exists
// without `overwrite`, a folder that does not exist or is not writable. Run before any work, so a
// long run does not end in an unwritable output.
void check_output(const std::string& path, bool overwrite);

void write_file(const std::string& path, const std::string& bytes, bool overwrite);

// Lets write_file replace `path` although it was read: a file meant to be rewritten (`verify
// GOLDEN --update` re-records the golden it replayed).
void release_input(const std::string& path);

// The folder a file is written in ("." for a bare name).
std::filesystem::path folder_of(const std::filesystem::path& target);

}  // namespace ptool
