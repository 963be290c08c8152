// What one run (the reference, or a parallel plan) leaves to compare: per step, full-size tensors
// under their golden names (step{k}.output, .loss, .grad.{fqn}, .param.{fqn}, .buffer.{fqn}), how
// the ranks' copies of each agree, and every module's output and input gradient in the order they
// were computed (for divergence localisation).
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_stats.h"
#include "core/memory_account.h"
#include "model/module.h"
#include "train/rank_memory.h"
#include "verify/compare.h"

namespace ptool {

// How the ranks' copies of a tensor compare (replicated tensors must be bitwise equal):
enum class ReplicaState {
    equal,    // every replica is bitwise the same
    sharded,  // held as shards only, no replicas ("-")
    differ,   // replicas that should agree differ ("DIFFER")
    ignored,  // an ignored module's: it differs across dp ranks, as it must
    synced,   // an ignored module's replicas agree: it was synchronised after all ("SYNCED")
};
const char* replica_state_name(ReplicaState s);  // "equal", "-", "DIFFER", "ignored", "SYNCED"
inline bool replica_failure(ReplicaState s) {
    return s == ReplicaState::differ || s == ReplicaState::synced;
}

// A module event is keyed by (microbatch, module FQN, phase, call): the call counts that module's
// events of that phase in the microbatch (a shared module is called more than once). Runs are
// matched by key, not by position, so a pipeline stage's events meet the reference's.
struct ModuleEvent {
    std::string fqn;
    Phase phase = Phase::forward;  // the module's output, or (backward) its input gradient
    int microbatch = 0, call = 0;
    Tensor full;                     // undefined when compared as recorded (diff)
    std::optional<TensorDiff> diff;  // against the reference's event at the same place
};

std::string event_key(const ModuleEvent& e);  // "MICROBATCH:PHASE:CALL:FQN"

// A StepRecord::replicas key, step{k}.grad_before_clip.{name}: that gradient's copies differed
// before clip_grad_norm scaled them (Recorder::before_clip; no tensor of the name is recorded).
inline constexpr const char* kGradBeforeClip = "grad_before_clip.";

struct StepRecord {
    int64_t step = 0;
    double seconds = 0;  // this step's forward + backward + optimizer (synchronised), not its recording
    std::vector<std::pair<std::string, Tensor>> tensors;
    // Compared as recorded (RecordOptions::compare_with, ::golden): the diffs by golden name, in
    // place of the tensors, against the reference's tensor and the golden file's.
    std::map<std::string, TensorDiff> vs_reference, vs_golden;
    // A parameter against the model's optimizer applied to this run's own gradients (AdamW): its
    // update is what its gradients allow (RecordOptions::shadow_optimizer).
    std::map<std::string, TensorDiff> vs_shadow;
    std::map<std::string, ReplicaState> replicas;
    std::vector<ModuleEvent> events;
};

// The step's recorded tensor of that name, or null (compared as recorded, or missing).
const Tensor* find_tensor(const StepRecord& step, const std::string& name);

struct RunRecord {
    std::vector<StepRecord> steps;
    CommCounter init_counts;  // collectives while building the parallel model (src_data_rank)
    CommCounter step_counts;  // collectives of all training steps (rank 0)
    double seconds = 0;       // training steps only
    int world_size = 1;
    std::string backend;  // "threads", "mpi", "cuda_local", "nccl", or "reference"
    // The initial parameters and buffers (init.param.*, init.buffer.*), kept for golden files.
    std::vector<std::pair<std::string, Tensor>> init_tensors;
    // Replica invariants after construction (data parallel): the digests (tensor_digest) of the
    // full parameters and buffers by state_dict name, before the first step; compared with the
    // reference's, so "bitwise equal" costs 8 bytes per tensor rather than a copy of the model.
    std::vector<std::pair<std::string, uint64_t>> init_state;
    std::vector<std::string> init_replicas_differ;  // state tensors whose replicas differ after construction
    int64_t unique_params = 0;                      // named_parameters() count: shared modules stay one
    int64_t dp_buckets = 0;                         // DDP buckets per step
    int64_t bucket_copy_bytes = 0;       // copied into/out of buckets per step (0 with bucket views)
    int64_t bucket_allreduce_bytes = 0;  // DDP's gradient all_reduce per step
    int64_t grad_bytes = 0;              // of the synchronised gradients (local shapes)
    std::vector<RankMemory> memory;      // per world rank, measured (a parallel run's)
};

}  // namespace ptool
