#include "core/turns.h"

#include <chrono>

namespace ptool {
namespace {

// Long enough that a hand-off (a few microseconds) is noise beside it, short beside a module of
// the models worth sharing cores for (a GEMM of gemm_mlp's is 5-30 ms on one core)
constexpr auto kQuantum = std::chrono::milliseconds(2);

thread_local TurnTaker* t_turns = nullptr;
thread_local std::chrono::steady_clock::time_point t_since;  // this thread's turn began

}  // namespace

void set_thread_turns(TurnTaker* turns) {
    t_turns = turns;
    t_since = std::chrono::steady_clock::now();
}

void turn_started() { t_since = std::chrono::steady_clock::now(); }

void take_turn() {
    if (!t_turns) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - t_since < kQuantum) return;
    t_turns->take_turn();  // turn_started() once it has a core again
}

}  // namespace ptool
