#include "verify/reference_logs.h"

#include <fmt/format.h>

#include "comm/communicator.h"

namespace ptool {
namespace {

// Rank 0's words on every rank.
std::vector<int64_t> broadcast_words(std::vector<int64_t> words, Communicator& world) {
    Tensor n = Tensor::scalar(static_cast<double>(words.size()), DType::int64).reshape({1});
    world.broadcast(n, 0);
    Tensor w({static_cast<int64_t>(n.item(0))}, DType::int64);
    for (size_t i = 0; i < words.size(); ++i) w.set(static_cast<int64_t>(i), static_cast<double>(words[i]));
    world.broadcast(w, 0);
    words.resize(static_cast<size_t>(w.numel()));
    for (int64_t i = 0; i < w.numel(); ++i) words[static_cast<size_t>(i)] = static_cast<int64_t>(w.item(i));
    return words;
}

}  // namespace

ReferenceLogs received_logs(const ReferenceLogs& logs, Communicator& world, OwnedLogs& into, bool routing,
                            bool float8) {
    const bool root = world.rank() == 0;
    if (routing) {
        std::vector<int64_t> w =
            broadcast_words(root && logs.routing ? logs.routing->words() : std::vector<int64_t>{}, world);
        if (!root && !w.empty()) (into.routing = std::make_unique<RoutingLog>(0, 0))->read_words(w);
    }
    if (float8) {
        std::vector<int64_t> w =
            broadcast_words(root && logs.float8 ? logs.float8->words() : std::vector<int64_t>{}, world);
        if (!root && !w.empty()) (into.float8 = std::make_unique<Float8Log>(0, 0))->read_words(w);
    }
    return root ? logs : into.view();
}

TakenFromLogs total_taken(const ReferenceLogs& logs, Communicator& world, bool shared) {
    TakenFromLogs t;
    t.routings = logs.routing ? logs.routing->replayed() : 0;
    t.float8_values = logs.float8 ? logs.float8->taken() : 0;
    if (shared) return t;
    Tensor n(Shape{2}, DType::float64);
    n.set(0, static_cast<double>(t.routings)), n.set(1, static_cast<double>(t.float8_values));
    world.all_reduce(n, ReduceOp::sum);
    return {static_cast<int64_t>(n.item(0)), static_cast<int64_t>(n.item(1))};
}

std::string routing_note(const RoutingLog& routing, bool replay_ties, int64_t replayed) {
    return fmt::format(
        "routing: {} of the reference's {} token routings are near-ties (their chosen experts "
        "could change with each router logit within rtol {:.2g}, atol {:.2g}); the parallel run "
        "{}",
        routing.ties(), routing.tokens(), routing.rtol(), routing.atol(),
        replay_ties ? fmt::format("routed {} of them otherwise and took the reference's choice", replayed)
                    : std::string("routed every token by itself (--no-tie-replay)"));
}

std::string float8_note(const Float8Log& log, bool replay_ties, int64_t taken) {
    return fmt::format(
        "float8: the reference logged its {} float8 operands before their casts; the parallel run {}",
        log.operands(),
        replay_ties
            ? fmt::format(
                  "cast the reference's value for {} elements (summed over ranks and calls) whose own "
                  "differed from it within rtol {:.2g} and atol {:.2g} of the smaller of its row's and "
                  "its column's largest magnitude, so that a near-tie rounds as the reference's did",
                  taken, log.rtol(), log.atol())
            : std::string("cast every value of its own (--no-tie-replay)"));
}

}  // namespace ptool
