#include "core/fqn_pattern.h"

#include <fnmatch.h>

#include <algorithm>

namespace ptool {

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

}  // namespace ptool
