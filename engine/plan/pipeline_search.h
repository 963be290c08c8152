// The planner's pipelines (plan/search.h): how a pipeline candidate of a model with one long repeat
// of L blocks is predicted without simulating its L blocks. The plan is simulated twice on meta
// tensors with 2 and with 3 blocks per stage (every stage the same), on the first rank of pp rank
// 0, of pp rank 1 (a middle one) and of the last pp rank; everything a stage costs grows by one
// block's worth from the first to the second, so a stage of n blocks is extrapolated linearly to n:
//   per stage   the seconds of one microbatch's forward and backward (compute and the blocking
//               tensor-parallel collectives: plan/time_model.h), and their GEMM FLOPs;
//   per rank    its peak memory (linear in the blocks of the stages it holds) and what it runs once
//               per step (the gradient sync, clip and optimizer step), and its data-parallel
//               collectives, overlapped with its compute as predict_step_time overlaps them;
//   a transfer  the activation's bytes over the pp link (the same at every boundary).
// The first stage's costs come from its own samples (the embedding), the last stage's from its own
// (norm, head and loss), the others' from a middle stage's. Stage boundaries are balanced by these
// costs (balance_blocks), and the step is the critical path of the schedule's real lists with these
// durations (plan/pipeline_time.h).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plan/pipeline_time.h"

namespace ptool {

// A pipeline plan's step costs at one number of blocks per stage (all stages alike), from the
// simulations of pp ranks 0, 1 and pp-1.
struct PipelineSample {
    // per stage (pp x v of them): one microbatch's forward and backward, seconds and GEMM FLOPs
    // (model FLOPs: without activation checkpointing's recompute)
    std::vector<double> forward, backward, forward_flops, backward_flops;
    // per stage, the pp rank that holds it (train/schedule.h stage_placement: the loop, or zbv's and
    // dualpipev's V); empty: the loop, stage s on rank s mod pp
    std::vector<int> stage_rank;
    // pp rank r's stages, in local order (ascending: the loop's r, r + pp, ..., the V's r, 2 pp - 1 - r)
    std::vector<int> stages_of(int r, int pp) const;
    // per stage, under a split backward (zero_bubble): the seconds of its I, part of `backward` (the
    // first stage's I does nothing: 0); empty otherwise
    std::vector<double> backward_input;
    // a stage's backward as its I and its W, seconds (no share sampled: halves)
    std::pair<double, double> split(int stage) const;
    std::vector<double> peak, tail;  // per pp rank: peak bytes, seconds of sync + clip + step
    // per pp rank, at its peak: the bytes that grow alike in every stage with its blocks (parameters,
    // their gradients, copies and optimizer state) and the activations (which grow in a stage with
    // its blocks times the microbatches it holds in flight); and each of its stages' microbatches in
    // flight at the rank's fullest point (the first where it holds the most, from the schedule's
    // action order: a proxy for the peak's moment, where interleaved stages' split can shift by one
    // later in the steady state): how a block more or less in one of its stages moves the rank's
    // peak when its stages hold unequal blocks (extrapolate_pipeline). Widened samples (pp > 4) take
    // the 4-rank sample's split (an approximation: the split changes with pp)
    std::vector<double> static_at_peak, activations_at_peak;
    std::vector<std::vector<double>> in_flight;
    std::vector<std::map<std::string, double>> phases;  // per pp rank: peak bytes per module pass
    // per pp rank, seconds: the compute and the data-parallel collectives (which overlap it) of its
    // forwards and backwards (at the sampled microbatches: they scale with the count) and of its tail
    std::vector<double> fb_compute, fb_overlap, tail_compute, tail_overlap;
    double transfer = 0;             // one send's seconds
    CommByOpDim fb_comm, tail_comm;  // pp rank 0's collectives and transfers: forwards, backwards and
                                     // sends (per sampled microbatches), and the tail
    // The data-parallel seconds rank r's compute does not hide when it runs `scale` times the
    // sampled microbatches.
    double exposed(int r, double scale) const;
};

// Samples a plan whose stages hold `k` blocks of `repeat` each: `simulate(rank)` simulates one world
// rank with the model and plan of sampled_stage_blocks (below: its own stages at k blocks, the
// others at one; the blocks' indices are read so), tracking the peak of each module pass
// (RankSimulation::phase_peaks), which are kept per stage's first and last block (their indices differ
// between the samples) and extrapolated each on its own: which pass peaks can change with the blocks (the
// head and loss with few, a block's recompute with many), as the planner's other extrapolation does. Its
// actions are timed on the links of `timing` where given (a wider pipeline's, whose pp ranks span more of the
// cluster: the samples widen_pipeline widens), else of `plan`.
PipelineSample sample_pipeline(const Plan& plan, const Cluster& c, DType compute, const std::string& repeat,
                               int k, const std::function<RankSimulation(int rank)>& simulate,
                               const Plan* timing = nullptr);

// The blocks each stage holds in the model and plan that pp rank `holder` is simulated with for a
// sample at k blocks a stage: k in each of its own stages, one in every other stage. A rank runs,
// holds and sends only its own stages' blocks (the others' go before anything is initialised:
// Run::keep_own_stage), and its stages' boundaries are between blocks alike, so its simulation is
// the one of the model with k blocks in every stage, but for the blocks' indices; the other stages'
// blocks would only cost their build and resolution (a fifth of the planner's time, when every
// stage held k). `stage_rank`: each stage's pp rank (stage_placement).
std::vector<int> sampled_stage_blocks(const std::vector<int>& stage_rank, int holder, int k);

// How many blocks beyond the first sample's (kStageSampled a stage) pp rank r's stages hold,
// in units of the second sample's growth (one block more on each of its stages): each stage's block
// weighed by its share of the static bytes (alike per stage) and of the activations (by the
// microbatches the stage holds in flight at the rank's peak). Equal stages: n - kStageSampled.
double rank_blocks_beyond(const PipelineSample& a, const PipelineSample& b, const std::vector<int>& blocks,
                          int r, int pp);

// The costs of stages holding blocks[s] blocks each, from samples at kStageSampled and one more blocks per
// stage. Blocks a stage in the first of a pipeline's two samples (the second: one more): as the flat search's
// kSampled (plan/search_state.h), so that a stage's middle blocks are sampled too.
constexpr int kStageSampled = 4;
PipelineSample extrapolate_pipeline(const PipelineSample& at2, const PipelineSample& at3,
                                    const std::vector<int>& blocks, int pp);

// The costs of a pipeline of pp ranks (pp > 4) from samples of pipelines of 3 and 4 ranks with the
// same dp, tp, schedule and stages (their microbatches pp or 2 pp each, as the pipeline's own
// samples): what a stage costs a microbatch, a transfer, and what a rank runs once per step (its
// tail) do not depend on pp; on pp rank 0, a middle rank and the last, the microbatches in flight at
// the peak grow linearly with pp (1F1B's pp - r; interleaved's warm-up, (v - 1) pp + 2 (pp - 1 - r)
// forwards, then one per backward), and so do the sampled microbatches' seconds and collectives:
// each is extended along the line through the two samples. The middle ranks take pp rank 1's. The
// last rank's peak is read at `last_peak_at` on that line: pp, or under 1F1B (whose last rank holds
// one microbatch whatever pp, and the samples ran 3 and 4) the plan's microbatches, each of whose
// outputs it keeps.
PipelineSample widen_pipeline(const PipelineSample& p3, const PipelineSample& p4, int pp, int last_peak_at);

// `total` blocks over `stages` stages, at least two each where there are twice as many blocks as
// stages (the samples' count: below it a stage's costs are extrapolated), else one, so that the slowest stage
// (its fixed cost extra[s] plus per_block seconds per block) is as fast as it can be: the first stage, which
// also runs the embedding, and the last, which runs the head and loss, get fewer blocks (torchtitan
// counts the embedding and the head as layers when it cuts Llama 3.1 405B's 126 blocks into 16
// stages). Ties go to the earlier stages.
std::vector<int> balance_blocks(int total, const std::vector<double>& extra, double per_block);
// The fewest blocks balance_blocks gives a stage: 2 where `total` is at least twice `stages`, else 1.
int least_stage_blocks(int total, int stages);

// The step on `schedule` with `costs` (its stages' forward and backward per microbatch, the
// transfer, each rank's tail).
PipelineTiming time_schedule(const Schedule& schedule, const PipelineSample& costs);

// The bubble of one round of `kind`'s lists at uniform stages (every forward, I and W one unit, a
// B two, transfers free), over the busiest rank's work: (p - 1)/(v m) for GPipe, 1F1B and
// interleaved 1F1B; about (p - 1)/(3m) for ZB-H1 (zero_bubble at v 1) and DualPipeV and (p - 1)/(6m)
// for ZB-V once m is past the warm-up (docs/planning.md "Zero-bubble schedules").
double uniform_bubble(ScheduleKind kind, int stages, int microbatches, int virtual_stages);

// The step of pipeline_schedule(kind, stages, microbatches, rounds, v) with `costs`, played whole up
// to `exact` stage-microbatches (stages x microbatches x rounds); past it, played at three smaller
// microbatch counts M, M + pp, M + 2 pp (M at least 4 pp, past the fill) and, where the step, its
// pipelined end and every rank's busy time grow by the same amount from one to the next (the
// schedule's steady state: every pp more microbatches add one period), extended linearly to
// `microbatches` (else played whole), once a play at 2M lies on the same line. A planner's schedule
// of 512 ranks and 4096 microbatches is 13M actions; tests/test_pipeline_time.cpp holds the
// extension to the whole play: exact but for a slower cycle of the lists that takes over late (the
// receives waited for at their consumer, plan/pipeline_time.h: interleaved at p 8, 0.1% short).
PipelineTiming time_pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds, int v,
                                      const PipelineSample& costs, int64_t exact = int64_t{1} << 16);

}  // namespace ptool
