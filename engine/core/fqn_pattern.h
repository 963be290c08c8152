// FQN patterns: fnmatch per dotted atom ("layers.*.net[1-2]" matches "layers.0.net1"; "" matches only
// ""), as plans name modules and the model's init names parameters.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace ptool {

bool fqn_matches(const std::string& pattern, const std::string& fqn);
// A module's name as a pattern matching only itself: `*`, `?`, `[` and `\` escaped (fnmatch's
// backslash), for the plans ptool writes (a model may name a module `net[1]`).
std::string fqn_escape(const std::string& name);

// Whether `name` (a module's or a parameter's) is `module` or under it; everything is under "" (the root).
// (no string built: the resolvers ask it of every parameter and unit)
inline bool fqn_under(const std::string& name, const std::string& module) {
    const size_t n = module.size();
    return n == 0 ||
           (name.size() >= n && name.compare(0, n, module) == 0 && (name.size() == n || name[n] == '.'));
}
// Whether `name` is under any of `modules` (fqn_under).
inline bool fqn_under_any(const std::string& name, const std::vector<std::string>& modules) {
    for (const std::string& m : modules)
        if (fqn_under(name, m)) return true;
    return false;
}

// Module names (in their order) matched against a plan's patterns: a pattern with no wildcard
// (`*`, `?`, `[`, `\`) is one hash lookup, one with wildcards a scan with fqn_matches; so a plan
// that names each of n modules (ptool plan's, for a model without repeats) resolves in O(n), not n^2.
class NameIndex {
public:
    explicit NameIndex(std::vector<std::string> names);
    // The indices of the names `pattern` matches, ascending.
    std::vector<size_t> matches(const std::string& pattern) const;
    const std::vector<std::string>& names() const { return names_; }

private:
    std::vector<std::string> names_;
    std::unordered_map<std::string, size_t> index_;
};

}  // namespace ptool
