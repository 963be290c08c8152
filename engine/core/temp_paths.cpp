#include "core/temp_paths.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"

namespace ptool {
namespace {

constexpr int kSlots = 32;
constexpr size_t kPathMax = kTempPathMax + 1;
char g_paths[kSlots][kPathMax];
std::atomic<int> g_used[kSlots];  // 1: g_paths[i] holds a registered path (lock-free: read in the handler)
std::mutex g_mutex;               // registration only; the handler takes no lock

struct Dirent64 {  // getdents64's record (no libc wrapper is async-signal-safe)
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[1];
};

bool dot_or_dotdot(const char* n) {
    return n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0));
}

// Removes what the folder open as `fd` holds, folders `depth` levels down too. Passes again from
// the start until one removes nothing: a folder's listing may skip entries when others go meanwhile.
void empty_folder(int fd, int depth) {
    alignas(8) char buf[2048];
    for (int pass = 0; pass < 64; ++pass) {
        bool removed = false;
        if (::lseek(fd, 0, SEEK_SET) != 0) return;
        for (long n; (n = ::syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0;)
            for (long off = 0; off < n;) {
                const auto* d = reinterpret_cast<const Dirent64*>(buf + off);
                off += d->reclen;
                if (dot_or_dotdot(d->name)) continue;
                if (::unlinkat(fd, d->name, 0) == 0) {
                    removed = true;
                    continue;
                }
                if (depth <= 0) continue;
                const int sub = ::openat(fd, d->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sub < 0) continue;
                empty_folder(sub, depth - 1);
                ::close(sub);
                removed |= ::unlinkat(fd, d->name, AT_REMOVEDIR) == 0;
            }
        if (!removed) return;
    }
}

void remove_path(const char* path) {
    if (::unlink(path) == 0) return;
    const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    empty_folder(fd, 8);
    ::close(fd);
    ::rmdir(path);
}

void remove_all_and_reraise(int sig) {
    for (int i = 0; i < kSlots; ++i)
        if (g_used[i].load(std::memory_order_acquire)) remove_path(g_paths[i]);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

// Every signal whose default action ends the process (man 7 signal: Term and Core), but SIGKILL
// and SIGSTOP, which cannot be caught, and the real-time ones (added from SIGRTMIN to SIGRTMAX: not
// constants). A signal left out left its temporary behind (SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
// SIGSTKFLT, SIGRTMIN+3 did); the faults (SIGSEGV, SIGABRT, ...) are a bug's, and still need not
// leave one.
constexpr int kEndingSignals[] = {SIGHUP,  SIGINT,    SIGQUIT, SIGILL,  SIGTRAP, SIGABRT, SIGBUS,    SIGFPE,
                                  SIGUSR1, SIGSEGV,   SIGUSR2, SIGPIPE, SIGALRM, SIGTERM, SIGSTKFLT, SIGXCPU,
                                  SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO,   SIGPWR,  SIGSYS};

// Handles sig with remove_all_and_reraise unless something else set it (an ignored SIGPIPE or
// SIGXFSZ stays ignored; a sanitizer's SIGSEGV handler stays its own).
void handle(int sig) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_handler = remove_all_and_reraise;
    ::sigaction(sig, &sa, nullptr);
}

}  // namespace

int track_temp(const std::string& path) {
    static const bool installed = [] {
        for (int sig : kEndingSignals) handle(sig);
        for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) handle(sig);
        return true;
    }();
    (void)installed;
    if (path.size() >= kPathMax || path.find('\0') != std::string::npos)
        throw RuntimeError(
            fmt::format("a temporary path of {} bytes: too long to remove on a signal", path.size()));
    std::lock_guard lock(g_mutex);
    for (int i = 0; i < kSlots; ++i)
        if (!g_used[i].load(std::memory_order_relaxed)) {
            std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
            g_used[i].store(1, std::memory_order_release);
            return i;
        }
    throw RuntimeError(
        fmt::format("more than {} temporary files at once (removing {} on a signal)", kSlots, path));
}

void untrack_temp(int slot) {
    if (slot < 0 || slot >= kSlots) return;
    std::lock_guard lock(g_mutex);
    g_used[slot].store(0, std::memory_order_release);
}

TempDir::TempDir(const std::string& prefix) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (ec) base = "/tmp";
    // registered before it exists, as an atomic write's file (core/files.cpp): made first, a signal
    // between the two left it behind. Unique in the process by a counter, against others by mkdir.
    static std::atomic<uint64_t> next{0};
    for (int attempt = 0;; ++attempt) {
        path_ = (base / fmt::format("{}-{}-{:06x}", prefix, ::getpid(), next++ & 0xffffff)).string();
        slot_ = track_temp(path_);
        if (::mkdir(path_.c_str(), 0700) == 0) return;
        const int err = errno;
        untrack_temp(slot_);
        if (err != EEXIST || attempt >= 100)
            throw RuntimeError(
                fmt::format("cannot create a temporary folder {}: {}", path_, std::strerror(err)));
    }
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    untrack_temp(slot_);
}

}  // namespace ptool
