#include "core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/temp_paths.h"

namespace ptool {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& msg) {
    throw InputError(SourceLocation{path, 0, 0}, msg);
}

// Descriptor limits and memory are resources (exit 3); a path that is not there is bad input.
[[noreturn]] void open_failed(const std::string& path, int err, const char* what) {
    if (err == EMFILE || err == ENFILE || err == ENOMEM)
        throw RuntimeError(fmt::format("{}: cannot open the file {}: {} (a resource ran out)", path, what,
                                       std::strerror(err)));
    refuse(path, err == ENOENT ? std::string("no such file")
                               : fmt::format("cannot open the file {}: {}", what, std::strerror(err)));
}

// The regular files read_file has read, by identity (device, inode): write_file does not replace
// them (an output that names an input, whatever its spelling) unless released (golden --update).
std::mutex g_read_mutex;
std::set<std::pair<dev_t, ino_t>> g_read;

void refuse_nul(const std::string& path) {
    if (path.find('\0') != std::string::npos)
        throw InputError(fmt::format("a file name with a NUL byte ('{}'): no file has one",
                                     path.substr(0, path.find('\0'))));
}

void write_all(int fd, const std::string& bytes, const std::string& path) {
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw RuntimeError(
                fmt::format("{}: write failed: {}", path, std::strerror(n < 0 ? errno : ENOSPC)));
        done += static_cast<size_t>(n);
    }
}

// The real path of a folder ("" when it has none): what its spelling names, however written.
std::string real_folder(const std::string& dir) {
    char buf[PATH_MAX];
    return ::realpath(dir.c_str(), buf) ? std::string(buf) : std::string();
}

bool all_digits(const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// This process's descriptor folder, resolved: /proc/PID/fd (what /dev/fd and /proc/self/fd name)
// or a thread's /proc/PID/task/TID/fd (/proc/thread-self/fd; the threads share one table). PID as
// /proc/self names it, which is the process's PID in the namespace /proc was mounted for.
bool own_descriptor_folder(const std::string& real) {
    const std::string own = real_folder("/proc/self/fd");
    if (own.empty() || real == own) return !own.empty();
    const std::string proc = own.substr(0, own.size() - 2);  // "/proc/PID/"
    if (real.rfind(proc, 0) != 0) return false;
    const std::string rest = real.substr(proc.size());
    const std::string task = "task/", fd = "/fd";
    return rest.size() > task.size() + fd.size() && rest.rfind(task, 0) == 0 &&
           rest.compare(rest.size() - fd.size(), fd.size(), fd) == 0 &&
           all_digits(rest.substr(task.size(), rest.size() - task.size() - fd.size()));
}

// The names in /dev for the standard descriptors (each a link to /proc/self/fd/N).
struct StandardName {
    const char* name;
    int fd;
};
constexpr StandardName kStandardNames[] = {{"stdin", 0}, {"stdout", 1}, {"stderr", 2}};

// The descriptor a path names through the kernel's links to this process's own descriptors
// (/dev/stdout, /dev/stderr, /dev/stdin, /dev/fd/N, /proc/self/fd/N, /proc/PID/fd/N,
// /proc/thread-self/fd/N): written through that descriptor, whatever it is open on. Followed as a
// symlink it reads "pipe:[N]" (no path), or the file the shell redirected to, which would then be
// replaced: `--json /dev/stdout >> log` destroyed the log. The folder is compared by its real
// path, not its spelling: /dev/fd//1, /proc/self/./fd/1 and /dev/../proc/self/fd/1 replaced the
// log as well.
std::optional<int> descriptor_of(const std::string& path) {
    const fs::path p(path);
    const std::string name = p.filename().string();
    if (name.empty() || name == "." || name == "..") return std::nullopt;
    const std::string dir = real_folder(folder_of(p).string());
    if (dir.empty()) return std::nullopt;
    if (dir == real_folder("/dev"))
        for (const StandardName& s : kStandardNames)
            if (name == s.name) return s.fd;
    if (name.size() > 9 || !all_digits(name) || !own_descriptor_folder(dir)) return std::nullopt;
    return std::stoi(name);
}

// The descriptor the output to fd writes: stdout's own once messages_to_stderr moved it (fd 1
// then holds stderr, so that what the command prints does not mix with the output).
std::atomic<int> g_stdout{1};
int output_descriptor(int fd) {
    return fd == 1 ? g_stdout.load() : fd;
}

// An output that is the process's stdout: from here on fd 1 is stderr (everything the command
// prints, "wrote ..." included, goes there) and the output alone the original stdout, kept
// aside. `golden record -o /dev/stdout > g.st` wrote the messages into the golden.
void messages_to_stderr() {
    if (g_stdout.load() != 1) return;
    std::fflush(stdout);  // printed before: still to the old stdout
    const int saved = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
    if (saved < 0) open_failed("/dev/stdout", errno, "(to keep it aside)");
    if (::dup2(2, 1) < 0) {  // no stderr: the messages are dropped rather than mixed in
        const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null < 0 || ::dup2(null, 1) < 0) {
            ::close(saved);
            open_failed("/dev/null", errno, "for the messages");
        }
        ::close(null);
    }
    g_stdout = saved;
}

// Refused unless descriptor fd is open for writing.
void check_descriptor(const std::string& path, int fd) {
    const int flags = ::fcntl(output_descriptor(fd), F_GETFL);
    if (flags < 0) refuse(path, fmt::format("descriptor {} is not open", fd));
    if ((flags & O_ACCMODE) == O_RDONLY)
        refuse(path, fmt::format("descriptor {} is not open for writing", fd));
}

// What writing `path` writes: its symlinks followed to the first name that is not one (or that
// names one of the process's own descriptors); `path` itself when it is no symlink.
std::string link_target(const std::string& path) {
    std::string at = path;
    struct stat st {};
    for (int hops = 0; !descriptor_of(at) && ::lstat(at.c_str(), &st) == 0 && S_ISLNK(st.st_mode); ++hops) {
        std::error_code ec;
        const fs::path link(at), to = fs::read_symlink(link, ec);
        if (ec || hops == 40)
            refuse(path, ec ? fmt::format("cannot read the symlink: {}", ec.message())
                            : std::string("a loop of symlinks"));
        at = (to.is_absolute() ? to : link.parent_path() / to).string();
    }
    return at;
}

// Devices, FIFOs and sockets are written through, never replaced.
void write_through(const std::string& path, const std::string& bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENXIO) refuse(path, "a FIFO with no reader: nothing would read what is written");
        open_failed(path, errno, "for writing");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    try {
        write_all(fd, bytes, path);
    } catch (...) {
        ::close(fd);
        throw;
    }
    if (::close(fd) != 0 && errno != EINTR)
        throw RuntimeError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

// A temporary's name beside its target: ".NAME.tmp-PID-N", N six hex digits of a counter
// (temp_prefix: what comes before the PID).
std::string temp_prefix(const fs::path& target) {
    return "." + target.filename().string() + ".tmp-";
}
std::string temp_name(const fs::path& target, long pid, uint64_t n) {
    return fmt::format("{}{}-{:06x}", temp_prefix(target), pid, n & 0xffffff);
}

// The writer's PID when `name` is exactly a temporary's name as temp_name makes it (a PID of at
// most 7 digits, Linux's largest being 2^22, then six lowercase hex digits); nullopt for any other
// name. A looser match took `.out.json.tmp-4000000-notes.yaml`, the run's own model, for a leftover.
std::optional<long> temp_writer(const std::string& name, const std::string& prefix) {
    if (name.rfind(prefix, 0) != 0) return std::nullopt;
    const std::string rest = name.substr(prefix.size());
    const size_t dash = rest.find('-');
    if (dash == std::string::npos || dash > 7 || rest[0] == '0' || !all_digits(rest.substr(0, dash)))
        return std::nullopt;
    const std::string n = rest.substr(dash + 1);
    if (n.size() != 6 || n.find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
    return std::stol(rest.substr(0, dash));
}

bool was_read(const struct stat& st) {
    std::lock_guard lock(g_read_mutex);
    return S_ISREG(st.st_mode) && g_read.count({st.st_dev, st.st_ino});
}

// The backstop: a regular file this command has read is not written (however it is named).
void refuse_if_read(const std::string& path, const struct stat& st) {
    if (was_read(st))
        refuse(path, "this command read it as an input: writing would replace it (name another file)");
}

// Leftovers of killed writers beside target: regular files named as its temporaries whose writer
// is gone. Never a file this command has read.
void remove_leftovers(const fs::path& target) {
    std::error_code ec;
    const std::string prefix = temp_prefix(target);
    for (const auto& entry : fs::directory_iterator(folder_of(target), ec)) {
        const std::optional<long> pid = temp_writer(entry.path().filename().string(), prefix);
        struct stat st {};
        if (!pid || ::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || was_read(st)) continue;
        if (::kill(static_cast<pid_t>(*pid), 0) != 0 && errno == ESRCH) fs::remove(entry.path(), ec);
    }
}

// A written temporary file and the path it is renamed over.
struct Staged {
    std::string tmp, path;
    int slot;  // track_temp's
    bool overwrite;
};

// The OutputGroups open on this thread and the files written in them, not yet renamed.
thread_local int g_groups = 0;
thread_local std::vector<Staged> g_staged;

// Without overwrite the rename never replaces a file: check_output's look before the work leaves a
// window (a file made while the output was written, another ptool's record of the same path), so
// the file is put in place by renameat2's RENAME_NOREPLACE, or by link() where the file system has
// no renameat2 (EINVAL, ENOSYS), and one found there is the same refusal as check_output's. A file
// system with neither (no hard links: EPERM, EOPNOTSUPP) gets a look and a rename, the window back.
int rename_noreplace(const Staged& s) {
    if (::renameat2(AT_FDCWD, s.tmp.c_str(), AT_FDCWD, s.path.c_str(), RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    if (::link(s.tmp.c_str(), s.path.c_str()) == 0) return ::unlink(s.tmp.c_str()), 0;
    if (errno != EPERM && errno != EOPNOTSUPP) return -1;
    struct stat st {};
    if (::lstat(s.path.c_str(), &st) == 0) return errno = EEXIST, -1;
    return std::rename(s.tmp.c_str(), s.path.c_str());
}

void put_in_place(const Staged& s) {
    if ((s.overwrite ? std::rename(s.tmp.c_str(), s.path.c_str()) : rename_noreplace(s)) != 0) {
        const int err = errno;
        ::unlink(s.tmp.c_str());
        untrack_temp(s.slot);
        if (err == EEXIST) refuse(s.path, "file exists (use --force to replace it)");
        throw RuntimeError(fmt::format("{}: rename failed: {}", s.path, std::strerror(err)));
    }
    untrack_temp(s.slot);
}

void discard(const Staged& s) {
    ::unlink(s.tmp.c_str());
    untrack_temp(s.slot);
}

// A regular file, or a path that does not exist yet: temp file, fsync, rename (in an OutputGroup:
// at its commit).
void write_atomic(const std::string& path, const std::string& bytes, bool overwrite) {
    const fs::path target(path);
    const fs::path dir = folder_of(target);
    remove_leftovers(target);
    // The name is registered before the file exists (removed if a signal ends the process before
    // the rename): created first, a signal between the two left it behind. Unique in the process by
    // a counter, against leftovers by O_EXCL.
    static std::atomic<uint64_t> next{0};
    std::string tmp;
    int fd = -1, slot = -1;
    for (int attempt = 0; fd < 0; ++attempt) {
        tmp = (dir / temp_name(target, ::getpid(), next++)).string();
        slot = track_temp(tmp);
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) break;
        const int err = errno;
        untrack_temp(slot);
        if (err != EEXIST || attempt >= 100) open_failed(path, err, "(its temporary file)");
    }
    auto fail = [&](const std::string& message) {
        ::unlink(tmp.c_str());
        untrack_temp(slot);
        throw RuntimeError(message);
    };
    try {
        write_all(fd, bytes, path);
    } catch (const RuntimeError& e) {
        ::close(fd);
        fail(e.what());
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0)
        fail(fmt::format("{}: flush failed: {}", path, std::strerror(errno)));
    ::chmod(tmp.c_str(), 0644);
    if (g_groups > 0)
        return g_staged.push_back({tmp, path, slot, overwrite});  // renamed by the group's commit
    put_in_place({tmp, path, slot, overwrite});
}

}  // namespace

std::string read_file(const std::string& path, size_t max_bytes, size_t max_stream_bytes) {
    refuse_nul(path);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) open_failed(path, errno, "");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ||
        S_ISSOCK(st.st_mode)) {
        ::close(fd);
        refuse(path, S_ISDIR(st.st_mode) ? "is a directory, not a file"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)
                         ? "is a device, not a file (ptool reads files and pipes)"
                     : S_ISSOCK(st.st_mode) ? "is a socket, not a file"
                                            : "cannot read the file");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a FIFO with no writer has read as empty
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
        ::close(fd);
        throw InputError(SourceLocation{path, 1, 1},
                         fmt::format("file is {} bytes, over the limit of {}", st.st_size, max_bytes));
    }
    if (!S_ISREG(st.st_mode))
        max_bytes = std::min(max_bytes, max_stream_bytes);  // a pipe says nothing of its size
    else {
        std::lock_guard lock(g_read_mutex);
        g_read.emplace(st.st_dev, st.st_ino);
    }
    std::string out;
    char chunk[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            refuse(path, fmt::format("cannot read the file: {}", std::strerror(err)));
        }
        if (n == 0) break;
        if (out.size() + static_cast<size_t>(n) > max_bytes) {
            ::close(fd);
            refuse(path,
                   fmt::format("reads more than {} bytes without ending (a device or a stream, not a file?)",
                               max_bytes));
        }
        out.append(chunk, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
}

void check_output(const std::string& path, bool overwrite) {
    refuse_nul(path);
    if (path.empty()) throw InputError("an empty file name: name a file to write");
    if (const std::optional<int> fd = descriptor_of(path)) {
        check_descriptor(path, *fd);
        if (*fd == 1) messages_to_stderr();
        return;
    }
    // what write_file writes: a symlink's target, beside which its temporary file is made (a
    // dangling link into a missing folder was refused only after the run)
    const fs::path target(link_target(path));
    if (descriptor_of(target.string())) return check_output(target.string(), overwrite);
    const fs::path dir = folder_of(target);
    // its temporary file beside it, at its longest (the largest PID Linux gives, 2^22), must be a
    // path the signal handler can hold (one near PATH_MAX was refused after the run's work, exit 3)
    const std::string tmp_name = temp_name(target, 1L << 22, 0xffffff);
    const size_t tmp_size = (dir / tmp_name).string().size();
    if (tmp_size > kTempPathMax)
        refuse(path,
               fmt::format("its temporary file's path would be {} bytes, over {}", tmp_size, kTempPathMax));
    if (tmp_name.size() > NAME_MAX)
        refuse(path, fmt::format("its temporary file's name would be {} bytes, over {} (the name is {})",
                                 tmp_name.size(), NAME_MAX, target.filename().string().size()));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {  // follows a symlink to what would be written
        if (S_ISDIR(st.st_mode)) refuse(path, "is a directory: name a file to write");
        if (S_ISREG(st.st_mode) && !overwrite) refuse(path, "file exists (use --force to replace it)");
        if (S_ISREG(st.st_mode) && ::access(path.c_str(), W_OK) != 0)
            refuse(path, "the file is not writable");
        return;
    }
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) refuse(path, fmt::format("the folder '{}' does not exist", dir.string()));
    if (::access(dir.c_str(), W_OK) != 0)
        refuse(path, fmt::format("the folder '{}' is not writable", dir.string()));
}

void release_input(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return;
    std::lock_guard lock(g_read_mutex);
    g_read.erase({st.st_dev, st.st_ino});
}

void write_file(const std::string& path, const std::string& bytes, bool overwrite) {
    refuse_nul(path);
    struct stat st {};
    if (const std::optional<int> fd = descriptor_of(path)) {  // its file description: a shell's >> appends
        check_descriptor(path, *fd);
        const int out = output_descriptor(*fd);
        // `--json /dev/fd/3 3<>INPUT`: the descriptor's file is an input as any other spelling is
        if (::fstat(out, &st) == 0) refuse_if_read(path, st);
        std::fflush(nullptr);  // what was printed before it arrives first (stdio buffers stdout to a file)
        return write_all(out, bytes, path);
    }
    const std::string at = link_target(path);  // write the target, keep the link
    if (at != path) return write_file(at, bytes, overwrite);
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) refuse(path, "is a directory: name a file to write");
        return write_through(path, bytes);
    }
    check_output(path, overwrite);
    if (::stat(path.c_str(), &st) == 0) refuse_if_read(path, st);
    write_atomic(path, bytes, overwrite);
}

OutputGroup::OutputGroup() {
    ++g_groups;
}

void OutputGroup::commit() {
    if (g_groups != 1) return;  // an inner group's files are the outer's
    std::vector<Staged> staged;
    staged.swap(g_staged);
    for (size_t i = 0; i < staged.size(); ++i) {
        try {
            put_in_place(staged[i]);
        } catch (...) {
            for (size_t j = i + 1; j < staged.size(); ++j) discard(staged[j]);
            throw;
        }
    }
}

OutputGroup::~OutputGroup() {
    if (--g_groups > 0) return;
    for (const Staged& s : g_staged) discard(s);  // not committed: an output failed
    g_staged.clear();
}

fs::path folder_of(const fs::path& target) {
    return target.has_parent_path() ? target.parent_path() : fs::path(".");
}

}  // namespace ptool
