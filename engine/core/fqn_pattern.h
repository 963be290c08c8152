// FQN patterns: fnmatch per dotted atom ("layers.*.net[1-2]" matches "layers.0.net1"; "" matches only
// ""), as plans name modules and the model's init names parameters.
#pragma once

#include <string>

namespace ptool {

bool fqn_matches(const std::string& pattern, const std::string& fqn);

}  // namespace ptool
