#include "model/routing_log.h"

#include "core/error.h"
#include "model/log_words.h"

namespace ptool {

void RoutingLog::record(int64_t step, int microbatch, const std::string& fqn, RoutedCall call) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_[{step, microbatch, fqn}] = std::move(call);
}

const RoutedCall* RoutingLog::find(int64_t step, int microbatch, const std::string& fqn) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = calls_.find({step, microbatch, fqn});
    return it == calls_.end() ? nullptr : &it->second;
}

int64_t RoutingLog::tokens() const {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t n = 0;
    for (const auto& [key, c] : calls_) n += static_cast<int64_t>(c.tie.size());
    return n;
}

int64_t RoutingLog::ties() const {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t n = 0;
    for (const auto& [key, c] : calls_)
        for (uint8_t t : c.tie) n += t;
    return n;
}

std::vector<int64_t> RoutingLog::words() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int64_t> w{static_cast<int64_t>(calls_.size())};
    for (const auto& [key, c] : calls_) {
        const auto& [step, mb, fqn] = key;
        w.insert(w.end(), {step, mb});
        put_text(w, fqn);
        w.insert(w.end(), {c.first_row, c.seq, c.k, static_cast<int64_t>(c.tie.size())});
        w.insert(w.end(), c.chosen.begin(), c.chosen.end());
        w.insert(w.end(), c.tie.begin(), c.tie.end());
    }
    return w;
}

void RoutingLog::read_words(const std::vector<int64_t>& w) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.clear();
    WordReader in(w, "routing log");
    auto next = [&] { return in.next(); };
    for (int64_t n = next(); n > 0; --n) {
        const int64_t step = next();
        const int mb = static_cast<int>(next());
        const std::string fqn = in.text();
        RoutedCall c;
        c.first_row = next(), c.seq = next(), c.k = next();
        const int64_t tokens = next();
        c.chosen.resize(static_cast<size_t>(tokens * c.k));
        for (int64_t& e : c.chosen) e = next();
        c.tie.resize(static_cast<size_t>(tokens));
        for (uint8_t& t : c.tie) t = static_cast<uint8_t>(next());
        calls_[{step, mb, fqn}] = std::move(c);
    }
}

}  // namespace ptool
