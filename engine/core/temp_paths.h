// Temporary files and folders that a signal must not leave behind.
//
// A destructor does not run when a signal ends the process (every signal whose default is to end
// it: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1/2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO,
// SIGPWR, SIGXCPU, the real-time signals, the faults; ptool ignores SIGXFSZ: a write past `ulimit
// -f` is exit 3 naming the file), so every temporary
// ptool makes (an atomic write's `.NAME.tmp-PID-N`, `plan --verify`'s `$TMPDIR/ptool-plan-*/`)
// is registered here while it exists: on one of those signals the handler removes every registered
// path (a folder with what it holds), with async-signal-safe calls only, and re-raises the signal
// with its default action, so the process still ends as the signal says. SIGKILL cannot be caught:
// core/files.h removes a killed writer's temporary files on the next write to the same path.
#pragma once

#include <string>

namespace ptool {

// The longest path track_temp takes, in bytes (a longer one: RuntimeError).
inline constexpr size_t kTempPathMax = 4095;

// Registers `path` for removal on a signal; returns its slot for untrack_temp. At most 32 at once
// (more: RuntimeError, exit 3). The handlers are installed on the first call, for each signal whose
// default ends the process and that nothing set otherwise (an ignored SIGPIPE stays ignored).
int track_temp(const std::string& path);
void untrack_temp(int slot);  // the path is gone or kept: no longer the handler's

// A folder `$TMPDIR/PREFIX-PID-N`, removed with what it holds at scope exit and on a signal (its
// name registered before the folder is made, so no signal falls between the two).
class TempDir {
public:
    explicit TempDir(const std::string& prefix);
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
    int slot_ = -1;
};

}  // namespace ptool
