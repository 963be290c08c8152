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
// file `.NAME.tmp-PID-N` in the same folder (N six hex digits), written, fsync'ed, renamed over
// NAME (without overwrite, never over a file: one made there since check_output looked is kept,
// the same InputError as check_output's, the temporary removed); on a signal that ends the process
// the temporary file is removed (core/temp_paths.h; SIGKILL cannot be caught: the next write to the
// same path removes regular files named exactly so whose writer is gone, never one the command
// read). A symlink is followed and its target written that way; a device, FIFO or socket is
// written through (/dev/null). A name for one of the process's own descriptors (/dev/stdout,
// /dev/fd/N, /proc/self/fd/N, however spelled: its folder is compared by real path) is written
// through that descriptor, unless it is open on a file the command read. A write that fails (disk
// full, EIO, EFBIG past `ulimit -f`) is a RuntimeError naming the file (exit 3); the target is
// never partial.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace ptool {

// max_bytes for a regular file, max_stream_bytes (at most max_bytes) for a pipe
std::string read_file(const std::string& path, size_t max_bytes, size_t max_stream_bytes = SIZE_MAX);

// InputError (exit 2) when `path` cannot be written: a directory, a regular file that exists
// without `overwrite`, a folder that does not exist or is not writable (a symlink's: its target's),
// a descriptor not open for writing. Run before any work, so a long run does not end in an
// unwritable output. An output that is the process's stdout (fd 1, any spelling) moves stdout
// aside for it: from then on everything the process prints to stdout goes to stderr, so the
// command's messages ("wrote ...") do not mix into the output (`golden record -o /dev/stdout > g`).
void check_output(const std::string& path, bool overwrite);

void write_file(const std::string& path, const std::string& bytes, bool overwrite);

// Lets write_file replace `path` although it was read: a file meant to be rewritten (`verify
// GOLDEN --update` re-records the golden it replayed).
void release_input(const std::string& path);

// The outputs a command writes together, all or none: while one is open (on this thread), the
// regular files write_file writes stay in their temporary files, renamed over their targets by
// commit(); a group ended without commit() (an output failed: `--junit /dev/full` beside `--json
// x.json`) removes them, so x.json is not left written alone. What is written through (a device, a
// FIFO, stdout) goes out at once and cannot be taken back, and a rename that fails at commit()
// (rare: the temporary is beside its target) leaves the files renamed before it.
class OutputGroup {
public:
    OutputGroup();
    ~OutputGroup();
    OutputGroup(const OutputGroup&) = delete;
    OutputGroup& operator=(const OutputGroup&) = delete;
    void commit();  // in a group inside another: nothing, the outer one's commit renames
};

// The folder a file is written in ("." for a bare name).
std::filesystem::path folder_of(const std::filesystem::path& target);

}  // namespace ptool
