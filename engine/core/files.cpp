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

// The descriptor a path names through the kernel's links to this process's own descriptors
// (/dev/stdout, /dev/stderr, /dev/stdin, /dev/fd/N, /proc/self/fd/N, /proc/PID/fd/N): written
// through that descriptor, whatever it is open on. Followed as a symlink it reads "pipe:[N]" (no
// path), or the file the shell redirected to, which would then be replaced: `--json /dev/stdout
// >> log` destroyed the log.
std::optional<int> descriptor_of(const std::string& path) {
    if (path == "/dev/stdin") return 0;
    if (path == "/dev/stdout") return 1;
    if (path == "/dev/stderr") return 2;
    for (const std::string& prefix :
         {std::string("/dev/fd/"), std::string("/proc/self/fd/"), fmt::format("/proc/{}/fd/", ::getpid())}) {
        if (path.rfind(prefix, 0) != 0) continue;
        const std::string n = path.substr(prefix.size());
        if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
            return std::nullopt;
        return std::stoi(n);
    }
    return std::nullopt;
}

// Refused unless descriptor fd is open for writing.
void check_descriptor(const std::string& path, int fd) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) refuse(path, fmt::format("descriptor {} is not open", fd));
    if ((flags & O_ACCMODE) == O_RDONLY)
        refuse(path, fmt::format("descriptor {} is not open for writing", fd));
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

// A regular file, or a path that does not exist yet: temp file, fsync, rename.
void write_atomic(const std::string& path, const std::string& bytes) {
    std::error_code ec;
    const fs::path target(path);
    const fs::path dir = folder_of(target);
    // leftovers of killed writers: ".NAME.tmp-PID-N" whose PID is gone
    const std::string prefix = temp_prefix(target);
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
        if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
            fs::remove(entry.path(), ec);
    }
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
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        fail(fmt::format("{}: rename failed: {}", path, std::strerror(errno)));
    untrack_temp(slot);
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
    if (const std::optional<int> fd = descriptor_of(path)) return check_descriptor(path, *fd);
    const fs::path target(path);
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
    if (const std::optional<int> fd = descriptor_of(path)) {  // its file description: a shell's >> appends
        check_descriptor(path, *fd);
        std::fflush(nullptr);  // what was printed before it arrives first (stdio buffers stdout to a file)
        return write_all(*fd, bytes, path);
    }
    std::string at = path;
    struct stat st {};
    for (int hops = 0; !descriptor_of(at) && ::lstat(at.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
         ++hops) {  // write the target, keep the link
        std::error_code ec;
        const fs::path link(at), to = fs::read_symlink(link, ec);
        if (ec || hops == 40)
            refuse(path, ec ? fmt::format("cannot read the symlink: {}", ec.message())
                            : std::string("a loop of symlinks"));
        at = (to.is_absolute() ? to : link.parent_path() / to).string();
    }
    if (at != path) return write_file(at, bytes, overwrite);
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) refuse(path, "is a directory: name a file to write");
        return write_through(path, bytes);
    }
    check_output(path, overwrite);
    if (::stat(path.c_str(), &st) == 0) {
        std::lock_guard lock(g_read_mutex);
        if (g_read.count({st.st_dev, st.st_ino}))
            refuse(path, "this command read it as an input: writing would replace it (name another file)");
    }
    write_atomic(path, bytes);
}

fs::path folder_of(const fs::path& target) {
    return target.has_parent_path() ? target.parent_path() : fs::path(".");
}

}  // namespace ptool
