#include "core/yaml_writer.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace ptool {

std::string yaml_quoted(const std::string& s) {
    YAML::Emitter e;
    e << YAML::EscapeNonAscii << YAML::DoubleQuoted << s;
    return e.c_str();
}

std::string yaml_scalar(const std::string& s) {
    static const std::set<std::string> words = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"};
    std::string lower(s);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    const bool word = !s.empty() && (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_') &&
                      !words.count(lower) && std::all_of(s.begin(), s.end(), [](unsigned char c) {
                          return std::isalnum(c) || c == '_' || c == '-' || c == '.';
                      });
    return word ? s : yaml_quoted(s);
}

std::string yaml_comment(const std::string& s) {
    const bool printable =
        std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= 0x20 && c < 0x7f; });
    return printable ? s : yaml_quoted(s);
}

}  // namespace ptool
