// Routing-aware verdicts for mixtures of experts (model/moe.h). Routing is discontinuous: a
// rounding difference in one router logit can send a token to another expert and change its output
// by O(1), so a correct parallel run would fail where a token's deciding margin is within rounding.
//
// The reference logs each moe call's routing, token by token, and marks the near-ties: tokens whose
// chosen set could change if every logit moved by up to the tolerance verify accepts on the
// router's logits, tol(l) = atol + rtol |l| (near_tie, model/moe_routing.h). The parallel run looks
// each of its tokens up: a near-tie it routed otherwise is given the reference's set (its own
// logits still give the weights), so every tensor after the router is compared element by element;
// any other token routes by itself, and a difference there is a real one (its logits left the
// tolerance, or the router is wrong), which verify localises to the gate's logits or the layer's
// routing weights. docs/architecture.md derives the bound.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace ptool {

// One moe call's routing on the reference: its microbatch's first global row and tokens per row,
// each token's chosen experts (k per token, best first), and whether it was a near-tie.
struct RoutedCall {
    int64_t first_row = 0, seq = 1, k = 1;
    std::vector<int64_t> chosen;
    std::vector<uint8_t> tie;
};

class RoutingLog {
public:
    RoutingLog(double rtol, double atol) : rtol_(rtol), atol_(atol) {}
    double rtol() const { return rtol_; }
    double atol() const { return atol_; }
    // The reference's (a call that recomputes is not logged again).
    void record(int64_t step, int microbatch, const std::string& fqn, RoutedCall call);
    // The parallel run's: the reference's call, or null.
    const RoutedCall* find(int64_t step, int microbatch, const std::string& fqn) const;
    void count_replayed(int64_t n) { replayed_ += n; }
    void reset_replayed() { replayed_ = 0; }
    int64_t replayed() const { return replayed_; }
    int64_t tokens() const;  // every logged token's routing
    int64_t ties() const;    // of which near-ties
    // As int64 words and back (the reference on rank 0, every rank of an mpirun job).
    std::vector<int64_t> words() const;
    void read_words(const std::vector<int64_t>& w);

private:
    double rtol_, atol_;
    mutable std::mutex mutex_;
    std::map<std::tuple<int64_t, int, std::string>, RoutedCall> calls_;
    std::atomic<int64_t> replayed_{0};
};

}  // namespace ptool
