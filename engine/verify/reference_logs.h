// What verify's reference logs for its parallel runs to follow at near-ties (model/module.h's
// ReferenceLogs): each moe call's routing (model/routing_log.h) and each float8 linear's operands
// before their casts (model/float8_log.h). Owned per reference; the ranks of an mpirun job receive
// rank 0's; what the ranks took from them is counted for the report's notes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/float8_log.h"
#include "model/module.h"
#include "model/routing_log.h"

namespace ptool {

class Communicator;

struct OwnedLogs {
    std::unique_ptr<RoutingLog> routing;
    std::unique_ptr<Float8Log> float8;
    ReferenceLogs view() const { return {routing.get(), float8.get()}; }
};

// On rank 0 `logs` itself; on the other ranks of an mpirun job rank 0's, broadcast (uncounted:
// verification's own) and read into `into`. `routing` and `float8` say which logs the job keeps
// (every rank knows: the model's experts, the plan's float8 section); one rank 0 does not hold (a
// golden replay's: no reference ran) arrives as none.
ReferenceLogs received_logs(const ReferenceLogs& logs, Communicator& world, OwnedLogs& into, bool routing,
                            bool float8);

// What the parallel run's ranks took from the logs (near-tie routings, float8 values): one shared
// count among rank threads, each process's own summed over an mpirun job.
struct TakenFromLogs {
    int64_t routings = 0, float8_values = 0;
};
TakenFromLogs total_taken(const ReferenceLogs& logs, Communicator& world, bool shared);

std::string routing_note(const RoutingLog& routing, bool replay_ties, int64_t replayed);
std::string float8_note(const Float8Log& log, bool replay_ties, int64_t taken);

}  // namespace ptool
