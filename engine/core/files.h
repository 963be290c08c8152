// Whole files in and out, safely.
//
// Reading: opened without blocking (a FIFO with no writer reads as empty instead of hanging), the
// type checked first (a directory is refused by name), and read with a byte cap (a device that
// never ends, /dev/zero, is refused when it passes the cap instead of filling memory).
//
// Writing never replaces what is not a regular file. A regular file (or a path that does not
// exist) is written atomically: a temporary file `.NAME.tmp-PID-XXXXXX` in the same folder,
// written, fsync'ed, renamed over NAME; on SIGINT, SIGTERM or SIGHUP the temporary file is removed
// (SIGKILL cannot be caught: the next write to the same path removes temp files whose writer is
// gone). A symlink is followed and its target written that way; a device, FIFO or socket is
// written through (/dev/null, /dev/stdout). A write that fails (disk full, EIO) is a RuntimeError
// naming the file (exit 3); the target is never partial.
#pragma once

#include <string>

namespace ptool {

std::string read_file(const std::string& path, size_t max_bytes);

// InputError (exit 2) when `path` cannot be written: a directory, a regular file that exists
// without `overwrite`, a folder that does not exist or is not writable. Run before any work, so a
// long run does not end in an unwritable output.
void check_output(const std::string& path, bool overwrite);

void write_file(const std::string& path, const std::string& bytes, bool overwrite);

}  // namespace ptool
