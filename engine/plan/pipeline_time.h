// A pipeline's step time: the critical path of its schedule (train/schedule.h), played action by
// action with each action's own duration. Every pipeline rank runs its list in order; a forward,
// backward, sync, clip or optimizer step takes its seconds. Transfers are timed as torch's
// pipelining runtime runs them on GPUs: each send and receive is posted where the list has it
// (isend / irecv) and nobody waits there; a compute that uses a receive (a forward its RECV_F, a
// backward or I its RECV_B) starts once the data has arrived, the transfer's seconds after both
// ends posted it. (ptool's own ranks send by rendezvous, which check_schedule plays to refuse a
// deadlock; a rendezvous wait at a receive placed early, as torch's lowering places them before a
// W that could run meanwhile, would cost the zero-bubble schedules their bubble.) The step ends
// when the last rank finishes.
//
// With every stage's forward taking t_f and backward t_b per microbatch and free transfers, GPipe
// and 1F1B over p ranks and m microbatches finish their forwards and backwards in
// (m + p - 1)(t_f + t_b): a bubble of (p - 1)/m of the work (interleaved 1F1B's v stages per rank,
// each 1/v of the work, make it (p - 1)/(v m)); at F = I = W each, torch's zero-bubble orders
// idle (p - 1) F (ZB-H1, ZB-V's last rank) and (p - 1)(F + B - 3W) (DualPipeV) beyond the work.
// tests/test_pipeline_time.cpp holds the critical path to these closed forms; docs/planning.md.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "plan/time_model.h"
#include "train/schedule.h"
#include "train/simulate.h"

namespace ptool {

// One entry of a pipeline rank's list: a compute action with its seconds, or a batch of sends and
// receives with each one's transfer seconds.
struct TimedActions {
    std::vector<Action> actions;  // one compute action, or a p2p batch
    std::vector<double> seconds;  // per action
};

struct PipelineTiming {
    double step = 0;             // when the last rank finishes its list
    double pipelined = 0;        // when the last rank finishes its last forward, backward or transfer
    std::vector<double> busy;    // per rank: seconds of forward and backward
    std::vector<double> finish;  // per rank: when it finishes its list
    double bubble = 0;           // (pipelined - max busy) / max busy: idle time over the work
};

// `ranks[r]`: pipeline rank r's list in order; stage s lives on rank s % ranks.size(). Throws
// RuntimeError naming the ranks and actions when the lists cannot all finish (a schedule
// check_schedule refuses).
PipelineTiming pipeline_critical_path(const std::vector<std::vector<TimedActions>>& ranks);

// The same lists flat, with nothing allocated per entry (a planner's schedule of 512 ranks and 4096
// microbatches has 13M actions): entry i of a rank is its actions [first[i], first[i + 1]) with
// their seconds; `actions` is not owned (a Schedule's list).
struct TimedList {
    std::span<const Action> actions;
    std::vector<double> seconds;  // per action
    std::vector<uint32_t> first;  // per entry its first action; then actions.size()
};
PipelineTiming pipeline_critical_path(const std::vector<TimedList>& ranks);

// One entry of a rank's simulated schedule on a cluster: each action's seconds (a transfer: its
// share of the batch's sent and received bytes over the pp link; a compute action: its compute and
// its blocking, tensor-parallel, collectives), and the compute and the data-parallel collectives
// within it (which overlap the compute: plan/time_model.h).
struct ActionTime {
    std::vector<double> seconds;  // per action of the entry
    double compute = 0, overlappable = 0;
};
ActionTime action_time(const ActionWork& aw, const Plan& plan, const Cluster& c, DType compute);

// A pipeline plan's step on a cluster: each pp rank's actions as its stage's rank classes simulated
// them (per action the slowest class: a forward or backward's compute and tensor-parallel
// collectives; a transfer's bytes over the pp link), played over the schedule. Sets every class's
// `pipeline`, `bubble` and `step` (the critical path, plus what the data-parallel collectives
// cannot hide behind the rank's compute, as predict_step_time adds it). `times[i]` is ranks[i]'s.
void time_pipeline(std::vector<StepTime>& times, const std::vector<PredictedRank>& ranks, const Plan& plan,
                   const Cluster& c, DType compute);

}  // namespace ptool
