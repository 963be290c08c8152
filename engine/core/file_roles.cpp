#include "core/file_roles.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/files.h"

namespace ptool {
namespace {

namespace fs = std::filesystem;

struct FileIdentity {
    dev_t dev = 0;
    ino_t ino = 0;
    std::string name;  // "" for a file that exists; the file name in the folder (dev, ino) otherwise
    bool written_through = false;  // a device, FIFO or socket: outputs write through it, replace nothing
    bool same(const FileIdentity& o) const { return dev == o.dev && ino == o.ino && name == o.name; }
};

// The file path names after symlinks, or where writing it would create it; nullopt when neither
// exists (a folder that is not there: the command's own checks say so).
std::optional<FileIdentity> identity(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0)
        return FileIdentity{st.st_dev, st.st_ino, "", !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)};
    std::error_code ec;
    fs::path at(path);
    for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(at, ec));
         ++hops) {  // a dangling link: its target
        const fs::path to = fs::read_symlink(at, ec);
        if (ec) return std::nullopt;
        at = to.is_absolute() ? to : at.parent_path() / to;
    }
    if (::stat(folder_of(at).c_str(), &st) != 0) return std::nullopt;
    return FileIdentity{st.st_dev, st.st_ino, at.filename().string(), false};
}

}  // namespace

FileRoles& FileRoles::input(const std::string& role, const std::string& path) {
    if (!path.empty()) entries_.push_back({role, path, false});
    return *this;
}

FileRoles& FileRoles::output(const std::string& role, const std::string& path) {
    if (!path.empty()) entries_.push_back({role, path, true});
    return *this;
}

void FileRoles::check() const {
    std::vector<std::optional<FileIdentity>> ids;
    for (const Entry& e : entries_) ids.push_back(identity(e.path));
    for (size_t i = 0; i < entries_.size(); ++i) {
        if (!entries_[i].output || !ids[i]) continue;
        for (size_t j = 0; j < entries_.size(); ++j) {
            if (j == i || !ids[j] || !ids[i]->same(*ids[j])) continue;
            if (entries_[j].output && (j > i || ids[i]->written_through))
                continue;  // /dev/null twice replaces nothing
            const Entry &out = entries_[i], &other = entries_[j];
            const std::string same = out.path == other.path ? "" : fmt::format(" ('{}')", other.path);
            const std::string why =
                other.output ? fmt::format("{} and {} name the same file{}: each output needs its own",
                                           other.role, out.role, same)
                             : fmt::format(
                                   "{} names the same file as the input {}{}: it would replace it; write "
                                   "elsewhere",
                                   out.role, other.role, same);
            throw InputError(SourceLocation{out.path, 0, 0}, why);
        }
    }
}

}  // namespace ptool
