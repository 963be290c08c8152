// Context parallelism (plan section context_parallel; torch's context_parallel(), torchtitan's cp):
// the batch's sequence split over the cp dim for the whole model. model/context_shard.h says which
// positions a rank holds and how attention sees the others'; this file checks that a plan can split
// a model's sequence and runs what cp adds to a step: every parameter is replicated over cp, each
// rank's gradients come from its own tokens' loss, and the gradients are averaged over cp (summed
// for a sum loss), as torchtitan's FSDP over dp_shard x cp averages them.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/context_shard.h"
#include "model/model.h"
#include "parallel/plan.h"

namespace ptool {

// InputError at the plan's context_parallel unless the model's batch has a sequence dim (dim 1 of
// its input and its output) that cuts into cp chunks (2 x cp with load_balance). Nothing without cp.
void check_context_parallel(const Model& model, const Plan& plan);

// This rank's positions of a sequence of `seq` tokens on the cp group `cp` (one rank: all of them).
ContextShard context_shard(const Plan& plan, int64_t seq, Communicator& cp);

// After backward: each gradient reduced over cp by `op` in place (averaged for a mean loss per call,
// each rank's loss a mean over its own positions; summed for a sum loss and under global_tokens:
// Run::cp_reduce), but those `reduced` says were (fully_shard over dp_shard x cp reduced them in its
// reduce_scatter).
void sync_context_gradients(const std::vector<std::pair<std::string, ParamPtr>>& params, ReduceOp op,
                            Communicator& cp, const std::function<bool(const Parameter*)>& reduced);

}  // namespace ptool
