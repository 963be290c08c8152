// What the schedule builders share (train/schedule.cpp, train/zero_bubble_schedule.cpp): the step's
// end, torch's loop placement, and the per-rank arithmetic of torch's interleaved schedules.
#pragma once

#include <algorithm>
#include <vector>

#include "train/schedule.h"

namespace ptool {

// The step's end on every rank: the data-parallel gradient sync, clip_grad_norm, the optimizer step.
void step_end(std::vector<Action>& out);

// torch's loop placement (generate_stage_to_rank_mapping): stage s on rank s mod pp.
std::vector<int> loop_stage_rank(int pp, int stages);

// One rank's ops of torch's interleaved schedules (_calculate_single_rank_operations): v m ops of
// which the first `warmup` are forwards alone (_get_warmup_ops with its multiply_factor: 2 for
// ScheduleInterleaved1F1B, 1 for ScheduleInterleavedZeroBubble), rounds of max(1, m / pp)
// microbatches; op k's forward runs on local stage (k / per_round) mod v, its backward (k from
// warmup) on v - 1 - ((k - warmup) / per_round) mod v.
struct InterleavedRankOps {
    int r, pp, v, per_round, ops, warmup;
    InterleavedRankOps(int rank, int pp_ranks, int virtual_stages, int m, int multiply_factor)
        : r(rank),
          pp(pp_ranks),
          v(virtual_stages),
          per_round(m / std::max(1, m / pp_ranks)),
          ops(v * m),
          warmup(std::min((v - 1) * per_round + multiply_factor * (pp - 1 - r), ops)) {}
    int forward_stage(int k) const { return ((k / per_round) % v) * pp + r; }
    int backward_stage(int k) const { return (v - 1 - ((k - warmup) / per_round) % v) * pp + r; }
};

}  // namespace ptool
