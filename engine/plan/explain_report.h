// What `ptool explain MODEL PLAN [--cluster C]` reports, computed: the model on meta tensors, the
// plan's explanation (plan/explain.h), each rank class's steps simulated (memory, work,
// collectives), the step time per rank class on the cluster, and the summary lines that describe
// the plan's dims and what happens at start. The CLI prints it as text and JSON; nothing here prints.
#pragma once

#include <optional>

#include "plan/cluster.h"
#include "plan/device_overheads.h"
#include "plan/explain.h"
#include "plan/time_model.h"
#include "train/simulate.h"

namespace ptool {

struct ExplainInputs {
    std::string model_path, model_text, dtype;  // dtype: --dtype ("" keeps the model's)
    std::string plan_path;
    std::vector<std::string> mesh;  // --mesh NAME=SIZE
    std::string cluster_path;       // "" for none
};

// A pipeline stage as explain shows it: its spine modules, its ranks, its sends and receives per
// step (from its simulation) and the microbatches whose activations it holds at once under the
// schedule (GPipe all of a round's; 1F1B at most pp - s).
struct StageExplain {
    int stage = 0;
    std::string first, last;  // its first and last spine modules
    std::vector<int> ranks;
    int64_t sends = 0, send_bytes = 0, recvs = 0, recv_bytes = 0;  // per step, one rank of the stage
    int in_flight = 0;
};

// A choice the framework memory model makes where PyTorch's allocations could be lower, and by how
// much at most (explain prints them: the prediction errs high by up to these).
struct MemoryAssumption {
    std::string what;
    double bytes = 0;
};

struct ExplainReport {
    Model model;  // on meta tensors: shapes only
    Plan plan;
    std::optional<Cluster> cluster;
    Explanation ex;
    int64_t steps = 1;  // what verify runs: the plan's verify.steps, else the model's
    // simulated: at least kSteadyStateSteps (3), whatever `steps` says, so that each class's peak is
    // the steady state (from the second step on the optimizer's state exists throughout, from the
    // third the caching allocator's segments are steady; its memory.first_step_peak is the first
    // step's, what a 1-step verify measures), and at most 4 (`steps: 100000` is not simulated
    // 100000 times)
    int64_t simulated_steps = kSteadyStateSteps;
    // per rank class; with a cluster each class's reserved peak is the allocator model's under the
    // GPU's memory less the runtime's and the cluster's reserve (train/simulate.h)
    std::vector<PredictedRank> memory;
    std::vector<DeviceOverheads> overheads;  // per rank class, with a cluster (its first rank's)
    std::vector<StepTime> times;             // per rank class, with a cluster
    // "mesh dp=2 x tp=2", "tensor parallel over 'tp' (2 ranks)", ..., "model input Replicate()"
    std::vector<std::string> summary;
    // the loss and its normalisation: "cross_entropy (ignore_index -100), loss_normalization
    // global_tokens: ..." (describe_loss)
    std::string loss;
    std::vector<std::string> at_start;  // the construction's collectives, one line each
    std::string data_parallel_title;    // "replicate", "fully_shard", "fully_shard over 2 dims (HSDP)"
    std::vector<StageExplain> stages;   // a pipeline's, in stage order
    double bubble_closed_form = 0;      // a pipeline's (p - 1) / (v m): the bubble at uniform stages
    std::vector<MemoryAssumption> assumptions;  // where the framework tally errs high, per rank
    std::string kernel_source;                  // with a cluster: how its kernel times are known
    std::vector<std::string>
        float8_linears;              // the plan's float8 section converts (parallel/float8_training.h)
    bool float8_all_gather = false;  // fully_shard gathers them in float8 (float8_all_gathers)
};

ExplainReport explain_report(const ExplainInputs& in);

// InputError at the plan where simulating its rank classes whole for `simulated_steps` would pass
// explain's bound on work (the product named, with the fix).
void check_explain_work(const Model& model, const Plan& plan, int64_t simulated_steps);

// One line per role of the plan's mesh ("tensor parallel over 'tp' (2 ranks)"), in the order the
// roles cut the model.
std::vector<std::string> describe_dims(const Plan& plan);

// The step's loss under the plan: its kind, ignore_index, and what its normalisation divides by and
// how data parallel combines the gradients.
std::string describe_loss(const Model& model, const Plan& plan);

}  // namespace ptool
