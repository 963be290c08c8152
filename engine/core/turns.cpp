#include "core/turns.h"

#include <chrono>

namespace ptool {
namespace {

// Longer than the stretch between a TP plan's collectives, which hand the cores round already (2 ms
// cost bench_verify's tp=8 about 5% in hand-offs and cold caches), and short beside a DDP rank's
// forward and backward (gemm_mlp at dp=4: 60 ms on one core)
constexpr auto kQuantum = std::chrono::milliseconds(10);

thread_local TurnTaker* t_turns = nullptr;
thread_local std::chrono::steady_clock::time_point t_since;  // this thread's turn began

}  // namespace

void set_thread_turns(TurnTaker* turns) {
    t_turns = turns;
    t_since = std::chrono::steady_clock::now();
}

void turn_started() {
    t_since = std::chrono::steady_clock::now();
}

void take_turn() {
    if (!t_turns) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - t_since < kQuantum) return;
    t_turns->take_turn();  // turn_started() once it has a core again
}

}  // namespace ptool
