#include "core/fqn_pattern.h"

#include <fnmatch.h>

#include <algorithm>

namespace ptool {

NameIndex::NameIndex(std::vector<std::string> names) : names_(std::move(names)) {
    index_.reserve(names_.size());
    for (size_t i = 0; i < names_.size(); ++i) index_.emplace(names_[i], i);
}

std::vector<size_t> NameIndex::matches(const std::string& pattern) const {
    std::vector<size_t> out;
    if (pattern.find_first_of("*?[\\") == std::string::npos) {  // a literal name
        if (auto it = index_.find(pattern); it != index_.end()) out.push_back(it->second);
        return out;
    }
    for (size_t i = 0; i < names_.size(); ++i)
        if (fqn_matches(pattern, names_[i])) out.push_back(i);
    return out;
}

bool fqn_matches(const std::string& pattern, const std::string& fqn) {
    if (pattern.empty() || fqn.empty()) return pattern.empty() && fqn.empty();
    if (std::count(pattern.begin(), pattern.end(), '.') != std::count(fqn.begin(), fqn.end(), '.'))
        return false;
    std::string p, f;  // one dot-separated part of each at a time, first mismatch out
    for (size_t pa = 0, fa = 0; pa <= pattern.size();) {
        const size_t pb = std::min(pattern.find('.', pa), pattern.size()),
                     fb = std::min(fqn.find('.', fa), fqn.size());
        p.assign(pattern, pa, pb - pa), f.assign(fqn, fa, fb - fa);
        if (fnmatch(p.c_str(), f.c_str(), 0) != 0) return false;
        pa = pb + 1, fa = fb + 1;
    }
    return true;
}

std::string fqn_escape(const std::string& name) {
    std::string out;
    out.reserve(name.size());
    for (const char c : name) {
        if (c == '*' || c == '?' || c == '[' || c == '\\') out += '\\';
        out += c;
    }
    return out;
}

}  // namespace ptool
