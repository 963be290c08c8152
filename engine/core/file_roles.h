// The files a command reads and the files it writes, by role ("MODEL", "--init", "--json", "-o"):
// an output that names an input, or another output, is refused before anything runs (InputError
// naming both roles), so `verify M P --json M` or `shrink M P -o P` cannot replace the model or the
// plan, and `--json F --junit F` cannot keep only the last. Files are compared by identity, not by
// spelling: device and inode after symlinks for a file that exists; for an output that does not
// exist yet, its folder's device and inode and its name (where write_file would create it).
#pragma once

#include <string>
#include <vector>

namespace ptool {

class FileRoles {
public:
    FileRoles& input(const std::string& role, const std::string& path);   // "" adds nothing
    FileRoles& output(const std::string& role, const std::string& path);  // "" adds nothing
    void check() const;

private:
    struct Entry {
        std::string role, path;
        bool output;
    };
    std::vector<Entry> entries_;
};

}  // namespace ptool
