#include "model/float8_log.h"

#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/log_words.h"

namespace ptool {

void Float8Logged::measure() {
    const auto nan = std::numeric_limits<float>::quiet_NaN();
    row_amax.assign(static_cast<size_t>(rows * seq), 0.0f), col_amax.assign(static_cast<size_t>(cols), 0.0f);
    auto keep = [&](float& m, float x) {
        m = std::isnan(x) || std::isnan(m) ? nan : std::max(m, std::fabs(x));
    };
    for (int64_t i = 0; i < rows * seq; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            const float x = values[static_cast<size_t>(i * cols + j)];
            keep(row_amax[static_cast<size_t>(i)], x), keep(col_amax[static_cast<size_t>(j)], x);
        }
}

void Float8Log::record(int64_t step, int microbatch, const std::string& fqn, Float8Role role,
                       Float8Logged v) {
    std::lock_guard<std::mutex> lock(mutex_);
    operands_[{step, microbatch, fqn, static_cast<int>(role)}] = std::move(v);
}

const Float8Logged* Float8Log::find(int64_t step, int microbatch, const std::string& fqn,
                                    Float8Role role) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = operands_.find({step, microbatch, fqn, static_cast<int>(role)});
    return it == operands_.end() ? nullptr : &it->second;
}

int64_t Float8Log::operands() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(operands_.size());
}

// The tolerance's doubles and each value's float32 bits, as int64 words.
std::vector<int64_t> Float8Log::words() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int64_t> w;
    put_real(w, rtol_), put_real(w, atol_);
    w.push_back(static_cast<int64_t>(operands_.size()));
    for (const auto& [key, v] : operands_) {
        const auto& [step, mb, fqn, role] = key;
        w.insert(w.end(), {step, mb, role});
        put_text(w, fqn);
        w.insert(w.end(), {v.first_row, v.seq, v.rows, v.cols, static_cast<int64_t>(v.values.size())});
        for (float f : v.values) w.push_back(std::bit_cast<uint32_t>(f));
    }
    return w;
}

void Float8Log::read_words(const std::vector<int64_t>& w) {
    std::lock_guard<std::mutex> lock(mutex_);
    operands_.clear();
    WordReader in(w, "float8 log");
    auto next = [&] { return in.next(); };
    rtol_ = in.real(), atol_ = in.real();
    for (int64_t n = next(); n > 0; --n) {
        const int64_t step = next();
        const int mb = static_cast<int>(next()), role = static_cast<int>(next());
        const std::string fqn = in.text();
        Float8Logged v;
        v.first_row = next(), v.seq = next(), v.rows = next(), v.cols = next();
        v.values.resize(static_cast<size_t>(next()));
        PTOOL_REQUIRE(static_cast<int64_t>(v.values.size()) == v.rows * v.seq * v.cols,
                      "float8 log words: {} values for [{} x {}, {}]", v.values.size(), v.rows, v.seq,
                      v.cols);
        for (float& f : v.values) f = std::bit_cast<float>(static_cast<uint32_t>(next()));
        v.measure();
        operands_[{step, mb, fqn, role}] = std::move(v);
    }
}

}  // namespace ptool
