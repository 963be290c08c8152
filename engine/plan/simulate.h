// Simulating a rank: the training steps a plan runs, executed by the one training loop (verify/
// run.h) on meta tensors (core/device_memory.h) with a simulated communicator. Every module,
// style hook, redistribution, fully_shard unit, bucket, mixed-precision copy and optimizer state
// is allocated as it is in a real run, with no bytes behind it and no kernel run, so the rank's
// memory account (core/memory_account.h) reports the peak a real run measures, use by use; the
// meta backend counts the work (GEMM FLOPs, bytes the other ops touch) and the counter the
// collectives. An 8B-parameter model's step costs milliseconds and kilobytes.
//
// What it predicts is the step as ptool runs it, which saves for backward what PyTorch's
// autograd saves for the same modules (docs/planning.md has the per-module terms and where
// PyTorch differs); `verify --json`'s measured peaks are the same quantity from real tensors.
#pragma once

#include <array>

#include "backend/meta/meta_backend.h"
#include "comm/comm_stats.h"
#include "core/memory_account.h"
#include "verify/run.h"
#include "verify/run_record.h"

namespace ptool {

struct RankSimulation {
    RankMemory memory;
    CommCounter step_comm;  // the last step's collectives
    MetaWork step_work;     // the last step's work
};

// Steps `steps` steps of `plan` as world rank `rank` on meta tensors. The model comes from
// in.model_text (in.device is ignored: meta). Throws InputError as a Run would (the lint).
RankSimulation simulate_rank(const RunInputs& in, const Plan& plan, int rank, int64_t steps);

// Every distinct rank's memory over `steps` steps (simulated, in rank order).
std::vector<RankMemory> predict_memory(const RunInputs& in, const Plan& plan, int64_t steps);

// The ranks whose memory can differ (uneven torch.chunk shards): every tp rank at dp rank 0 and at
// the last dp rank, by world rank; the rest repeat one of them.
std::vector<int> distinct_ranks(const Plan& plan);

}  // namespace ptool
