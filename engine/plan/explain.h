// ptool explain: what a plan does, without starting any rank. Lint (resolve_plan), then per
// module: pattern, style, parameter placements and local shapes per rank, the collectives of one
// training step with their bytes, and the parameter memory of each rank.
//
// Activation shapes come from one forward pass of the model on one device. Collectives are
// derived from the same redistribution rules the style hooks execute (redistribute_cost mirrors
// redistribute), and tests check them against the counts a verify run measures.
#pragma once

#include <functional>

#include "parallel/parallelize.h"

namespace ptool {

struct CommCost {
    std::string op;  // as CommCounter names them
    int64_t bytes = 0;
    std::string module, phase;  // "forward" | "backward"
};

// The collectives redistribute(from -> to) runs for a tensor of shape `global` (bytes counted as CommCounter does).
std::vector<CommCost> redistribute_cost(const Placement& from, const Placement& to, const Shape& global, int ranks,
                                        size_t element_size);

struct ParamLayout {
    std::string fqn;
    Placement placement;
    Shape full;
    std::vector<Shape> local;  // per rank of the tp dim
};

struct ModuleExplain {
    std::string fqn, pattern, style;
    Shape input, output;  // global
    std::vector<ParamLayout> params;
};

struct Explanation {
    Resolution resolution;
    int tp = 1;
    int dp = 1;
    std::vector<std::string> data_parallel;  // what replicate/fully_shard do: buckets, units (lines)
    std::vector<ModuleExplain> modules;
    std::vector<CommCost> step_comm;   // one training step, in execution order (forward, then backward)
    std::vector<int64_t> param_bytes;  // per tp rank
    std::vector<int64_t> training_bytes;  // parameters + gradients + optimizer state, per tp rank
    // What verify's reference keeps per step on rank 0's host (every tensor it compares, full
    // size: parameters, gradients, buffers, output, loss, each module's output and input gradient).
    int64_t record_step_bytes = 0;
};

Explanation explain_plan(Model& model, const Plan& plan);

// The data-parallel part (explain_dp.cpp): DDP's buckets and buffer broadcasts, fully_shard's
// all_gathers and reduce_scatters, SyncBatchNorm's collectives, added to ex.step_comm; the
// parameter bytes fully_shard leaves each rank. tp_local(p): a parameter's numel on tp rank r.
void explain_data_parallel(const Model& model, const Plan& plan, Explanation& ex,
                           const std::function<Shape(const Parameter*, int tp_rank)>& tp_local);

}  // namespace ptool
