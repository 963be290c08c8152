// Numbers read from text (command-line flags, --mesh NAME=SIZE, environment variables, YAML
// scalars): the whole string or nothing. std::stoi("2abc") is 2 and std::stod("1e3") read as an
// integer is 1; here a string is a number only when every character belongs to it, an integer only
// when it has no fraction or exponent, and a real only when it is finite (no "nan", "inf", hex).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ptool {

std::optional<int64_t> parse_whole_int(const std::string& s);  // [-]digits, within int64
std::optional<double> parse_finite(const std::string& s);      // a finite decimal number: 1, -0.5, 1e-3, .5
// What a flag's message says the text should be, or "" when s is an integer in [lo, hi] / a finite
// number in [lo, hi] (above lo when lo_open).
std::string check_int_text(const std::string& s, int64_t lo, int64_t hi);
std::string check_real_text(const std::string& s, double lo, double hi, bool lo_open);

}  // namespace ptool
