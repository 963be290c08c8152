// What one run (the reference, or a parallel plan) leaves to compare: per step, full-size tensors
// under their golden names (step{k}.output, .loss, .grad.{fqn}, .param.{fqn}, .buffer.{fqn}), the
// replicated tensors that differed across ranks, and every module's output and input gradient in
// the order they were computed (for divergence localisation).
#pragma once

#include <string>
#include <vector>

#include "comm/comm_stats.h"
#include "core/tensor.h"

namespace ptool {

struct ModuleEvent {
    std::string fqn;
    std::string phase;  // "forward" (the module's output) or "backward" (its input gradient)
    Tensor full;
};

struct StepRecord {
    int64_t step = 0;
    std::vector<std::pair<std::string, Tensor>> tensors;
    std::vector<std::string> inconsistent;  // replicated tensors whose copies differ between ranks
    std::vector<std::string> sharded;       // tensors held as shards (no replicas to compare)
    std::vector<ModuleEvent> events;
};

struct RunRecord {
    std::vector<StepRecord> steps;
    CommCounter init_counts;  // collectives while building the parallel model (src_data_rank)
    CommCounter step_counts;  // collectives of all training steps (rank 0)
    double seconds = 0;       // training steps only
    int world_size = 1;
    std::string backend;      // "threads", "mpi", or "reference"
};

}  // namespace ptool
