// Simulating a rank: the training steps a plan runs, executed by the one training loop (train/
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
#include <map>
#include <string>

#include "backend/meta/meta_backend.h"
#include "comm/comm_stats.h"
#include "core/memory_account.h"
#include "train/rank_memory.h"
#include "train/run.h"

namespace ptool {

// One action of a rank's schedule (or one batch of its consecutive sends and receives) in the last
// simulated step: what it computed and communicated. A pipeline's step time is the critical path
// of these over the stages (plan/pipeline_time.h).
struct ActionWork {
    std::vector<Action> actions;  // one, or a p2p batch
    MetaWork work;
    CommByOpDim comm;
};

struct RankSimulation {
    RankMemory memory;
    CommCounter step_comm;                       // the last step's collectives
    MetaWork step_work;                          // the last step's work
    std::vector<ActionWork> actions;             // a pipeline's last step's, in the rank's schedule order
    std::map<std::string, int64_t> phase_peaks;  // with track_phases: the peak within each module pass
    bool last_step_replayed = false;             // simulate_rank's replay_last took
};

// The steps a prediction simulates at least: the optimizer's state exists from the second, and
// PyTorch's caching allocator reaches its steady segments by the third (measured on an H200,
// 2026-11-28, bench/validation/h200: a Llama-3.2-3B-shaped model at 4 x 2048 reserved 92.88 GiB in
// its second step and 96.79 from its third on; the allocator replay 93.94 and 97.85).
constexpr int64_t kSteadyStateSteps = 3;

// Steps `steps` steps of `plan` as world rank `rank` on meta tensors. The model comes from
// in.model_text (in.device is ignored: meta). Throws InputError as a Run would (the lint). Every
// allocation is replayed through PyTorch's caching allocator (core/allocator_model.h) with
// `allocator_capacity` bytes (0: unbounded) for memory.reserved_peak. `resolved`: `plan` already
// resolved (against a model of in.model_text), which the Run rebinds instead of resolving again.
// `replay_last`: from 3 steps on, the last step's allocations are the one before's replayed through
// the allocator model (AllocatorModel::replay_step), not simulated again, where that step handed its
// objects on as a steady state does: the same peaks, reserved and allocated, without running the
// step's modules (its work and collectives are the step before's, which are the same).
RankSimulation simulate_rank(const RunInputs& in, const Plan& plan, int rank, int64_t steps,
                             bool track_phases = false, size_t allocator_capacity = 0,
                             const ResolvedPlan* resolved = nullptr, bool replay_last = true);

// Before a single-device run on the host (ptool run, golden record): its peak predicted on meta
// tensors (simulate_rank, rank 0, `steps` steps) against the host's available memory, so that a
// model too large for it is exit 3 naming both (RuntimeError) rather than the kernel's OOM kill.
// Nothing where the device is not the CPU or the available memory is unknown; a prediction that
// fails for another reason (an input error included) is left to the run, which says it.
void require_host_memory(const RunInputs& in, const Plan& plan, int64_t steps,
                         const ResolvedPlan* resolved = nullptr);

// Builds world rank `rank`'s Run of `plan` on meta tensors and runs nothing: every check a run makes
// before its first step (its pipeline stages, expert and fully_shard divisibility, ...), at the cost
// of building the model once (`ptool shrink` holds a plan to the real model so).
void check_run(const RunInputs& in, const Plan& plan, int rank);

// Ranks that hold tensors of the same sizes: `ranks` (world ranks, ascending), represented by the
// first. Two ranks are in one class when torch.chunk gives them pieces of the same length of every
// dimension a plan can split (each parameter dimension and the batch's, over tp, over dp, the tp
// piece over fully_shard's dim, the whole dim over it (HSDP x TP: a dim tp does not cut), a
// parameter's rows (tp piece and whole) over fully_shard's dim x cp flattened where it shards over
// dp_shard x cp, and a cp rank's positions over tp (sequence parallelism)): what differs between
// them is values, not sizes.
// Not in the key: ZeRO's flat bucket shards (the last dp rank's may be shorter), which the first
// rank's simulation then prices high, never low.
// Ranks of different pipeline stages (pp coordinates) hold different layers: never one class.
struct RankClass {
    std::vector<int> ranks;
};
std::vector<RankClass> rank_classes(const Model& model, const Plan& plan);

struct PredictedRank {
    RankSimulation sim;      // of the class's first rank
    std::vector<int> ranks;  // every rank it stands for
};
// Each rank class simulated for `steps` steps, on up to `threads` threads (0: one per core); in
// class order. `model` is the loaded model (on meta: load it under MetaAllocation); `resolution`:
// resolve_plan(model, plan) when the caller made it (explain's), which every class's Run rebinds.
std::vector<PredictedRank> predict_ranks(const RunInputs& in, const Model& model, const Plan& plan,
                                         int64_t steps, unsigned threads = 0, size_t allocator_capacity = 0,
                                         const Resolution* resolution = nullptr);

}  // namespace ptool
