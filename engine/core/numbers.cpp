#include "core/numbers.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace ptool {

std::optional<int64_t> parse_whole_int(const std::string& s) {
    if (s.empty()) return std::nullopt;
    const size_t sign = s[0] == '-', digits = s.size() - sign;
    if (digits == 0 || digits > 19 || s.find_first_not_of("0123456789", sign) != std::string::npos)
        return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno == ERANGE || *end) return std::nullopt;
    return v;
}

std::optional<double> parse_finite(const std::string& s) {
    // digits, one '.', an exponent after a digit: what strtod takes, less its spaces, hex, nan and inf
    if (s.empty()) return std::nullopt;
    size_t i = s[0] == '-' || s[0] == '+' ? 1 : 0, mantissa = 0;
    bool dot = false;
    for (; i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '.' && !dot)); ++i) {
        dot |= s[i] == '.';
        mantissa += s[i] != '.';
    }
    if (mantissa == 0) return std::nullopt;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
        const size_t exp_start = i;
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
        if (i == exp_start) return std::nullopt;
    }
    if (i != s.size()) return std::nullopt;
    const double v = std::strtod(s.c_str(), nullptr);
    if (!std::isfinite(v)) return std::nullopt;
    return v;
}

std::string check_int_text(const std::string& s, int64_t lo, int64_t hi) {
    const auto v = parse_whole_int(s);
    if (v && *v >= lo && *v <= hi) return "";
    return fmt::format("expected a whole number in [{}, {}], got '{}'", lo, hi, s);
}

std::string check_real_text(const std::string& s, double lo, double hi, bool lo_open) {
    const auto v = parse_finite(s);
    if (v && (lo_open ? *v > lo : *v >= lo) && *v <= hi) return "";
    return fmt::format("expected a finite number in {}{:g}, {:g}], got '{}'", lo_open ? "(" : "[", lo, hi, s);
}

}  // namespace ptool
