// A reference log as int64 words and back (model/routing_log.h, model/float8_log.h): what rank 0
// broadcasts to the ranks of an mpirun job. Each word stays below 2^53 (a broadcast carries doubles).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace ptool {

// a double in two words of 32 bits each
inline void put_real(std::vector<int64_t>& w, double d) {
    const auto bits = std::bit_cast<uint64_t>(d);
    w.insert(w.end(), {static_cast<int64_t>(bits >> 32), static_cast<int64_t>(bits & 0xffffffffu)});
}

inline void put_text(std::vector<int64_t>& w, const std::string& s) {
    w.push_back(static_cast<int64_t>(s.size()));
    for (char ch : s) w.push_back(static_cast<unsigned char>(ch));
}

class WordReader {
public:
    WordReader(const std::vector<int64_t>& w, const char* what) : w_(w), what_(what) {}
    int64_t next() {
        PTOOL_REQUIRE(at_ < w_.size(), "{} words end early", what_);
        return w_[at_++];
    }
    double real() {
        const auto high = static_cast<uint64_t>(next());
        return std::bit_cast<double>(high << 32 | static_cast<uint64_t>(next()));
    }
    std::string text() {
        std::string s(static_cast<size_t>(next()), ' ');
        for (char& ch : s) ch = static_cast<char>(next());
        return s;
    }

private:
    const std::vector<int64_t>& w_;
    const char* what_;
    size_t at_ = 0;
};

}  // namespace ptool
