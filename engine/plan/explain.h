// ptool explain: what a plan does, without running anything. Everything comes from the plan's
// resolution and its layout pass (parallel/layout_pass.h): per styled module its pattern, style,
// input and output shapes and parameter placements with the local shapes per rank; the collectives
// of one training step with their bytes (the styles' rules and data parallelism's); the parameter
// memory of each rank; and what verify's reference keeps per step. Tests check the collectives
// against the counts a verify run measures and the record size against a reference's record.
#pragma once

#include <functional>

#include "parallel/parallelize.h"

namespace ptool {

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
    std::vector<std::string> data_parallel;    // what replicate/fully_shard do: buckets, units (lines)
    std::vector<std::string> expert_parallel;  // which experts each ep rank owns, the dispatch (lines)
    std::vector<ModuleExplain> modules;
    std::vector<CommCost> step_comm;     // one training step, in execution order (forward, then backward)
    std::vector<CommCost> zero_gathers;  // ZeRO: the updated shards' all_gathers, after the optimizer step
    // What verify's reference keeps per step on rank 0's host (every tensor it compares, full
    // size: parameters, gradients, buffers, output, loss, each module's output and input gradient).
    int64_t record_step_bytes = 0;
};

// `resolved`: resolve_plan(model, plan) when the caller made it (explain's report hands the same one
// to the simulations): the explanation works on a copy of it (explaining data parallel rebuckets it).
Explanation explain_plan(const Model& model, const Plan& plan, const Resolution* resolved = nullptr);

// The data-parallel part (explain_dp.cpp): DDP's buckets and buffer broadcasts, fully_shard's
// all_gathers and reduce_scatters, SyncBatchNorm's collectives, added to ex.step_comm; the
// parameter bytes fully_shard leaves each rank. tp_local(p): a parameter's shape on tp rank r.
void explain_data_parallel(const Model& model, const Plan& plan, Explanation& ex,
                           const std::function<Shape(const Parameter*, int tp_rank)>& tp_local);
// Context parallel's collectives per step into ex.step_comm (explain_cp.cpp): each attention's
// all_gathers of its keys and values (again where a checkpointed region recomputes it) and the
// reduce_scatters of their gradients, per microbatch; each gradient's all_reduce over cp but those
// fully_shard reduced over dp_shard x cp.
void explain_context_parallel(const Model& model, const Plan& plan, Explanation& ex,
                              const std::function<Shape(const Parameter*, int tp_rank)>& tp_local);
// Expert parallel's (explain_ep.cpp): each moe layer's all_to_alls per microbatch (the counts per
// expert, its tokens out and its experts' outputs back in forward, again where it is recomputed;
// the gradients out and back in backward), with balanced routing (every rank sends and receives
// tokens x top_k rows: an imbalance factor of 1), and each owned expert's gradient all_reduce over
// the data dims but ep; ex.expert_parallel's lines say who owns what. Without ep too: a moe layer's
// load-balancing loss's all_reduce of its statistics over the ranks whose tokens differ, per call.
void explain_expert_parallel(const Model& model, const Plan& plan, Explanation& ex,
                             const std::function<Shape(const Parameter*, int tp_rank)>& tp_local);
// Whether module `fqn` runs its forward again in backward (under a checkpointed or selective region).
bool recomputed_in_backward(const Resolution& res, const std::string& fqn);

}  // namespace ptool
