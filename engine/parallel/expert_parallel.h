// Expert parallelism (torchtitan's ep, Megatron's expert-model-parallel): every moe layer's experts
// split over the ranks of a data dim the plan borrows (expert_parallel.mesh_dim). With E experts on
// ep ranks, rank r owns experts [r E/ep, (r+1) E/ep) (torch's Shard(0) of the stacked experts); the
// others' parameters are absent on it (Placement::Owned, zero-sized locally).
//
// Each rank routes its own tokens (it is a data rank: its rows of the batch), then (model/moe.h):
//   dispatch  all_to_all of the token counts per expert, then all_to_all_v of the token rows, each
//             rank's rows grouped by owner, by expert within it;
//   compute   each owned expert once per microbatch on the rows every rank sent it, rank-major;
//   combine   all_to_all_v of the outputs back, placed at their tokens and weighted by the router.
// Backward runs the same exchanges on the gradients.
//
// Gradients: the non-expert parameters are data parallel's (DDP's buckets, fully_shard's units) as
// before; an expert's gradient on its owner is the sum of every ep rank's tokens' contributions, so
// it is divided by ep and averaged over the data dims but the borrowed one (its replicas), which is
// data parallel's average over every data rank (under loss_normalization global_tokens, where data
// parallel sums, it is not divided and is summed over its replicas). Where ep borrows HSDP's dp_replicate,
// the ranks of a dp_shard group own the same experts and fully_shard shards them over it (a unit per moe
// layer's experts: torchtitan's fully_shard of the experts over dp_mod_ep), so their reduce_scatter over
// dp_shard is that average and there are no replicas left. Under tensor parallelism inside the
// experts each tp rank dispatches over its own ep group (the tp ranks route the same tokens alike).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "backend/backend.h"
#include "model/model.h"
#include "parallel/device_mesh.h"
#include "parallel/plan.h"

namespace ptool {

struct ExpertParallelResolution {
    bool active = false;
    int size = 1;                          // the borrowed dim's ranks
    std::map<std::string, int> owner;      // an expert parameter's FQN -> the ep rank that owns it
    std::vector<std::string> layers;       // the moe layers' FQNs
    ReduceOp grad_reduce = ReduceOp::avg;  // data parallel's (Plan::gradient_reduction)
    // layers whose experts' gradients are scaled as the other normalisation would (fault injection's:
    // not divided by ep under mean_per_call, divided under global_tokens; empty otherwise)
    std::set<std::string> wrong_scale;
};

// The rank owning expert e of `experts` on `ep` ranks (contiguous blocks).
inline int expert_owner(int64_t e, int64_t experts, int ep) {
    return static_cast<int>(e / (experts / ep));
}

// Errors (exit 2, at the section): a model without a moe layer (unless !whole_model: a pipeline
// stage's part of the model may hold none), experts that do not divide over ep.
ExpertParallelResolution resolve_expert_parallel(const Model& model, const Plan& plan,
                                                 bool whole_model = true);

// One rank's expert parallelism: drops the experts it does not own (their parameters zero-sized,
// before anything is moved to the device) and averages the owned experts' gradients after backward.
class ExpertParallel {
public:
    // ep: the borrowed dim's group; replicas: the other data dims' (null when there are none).
    ExpertParallel(Model& model, const ExpertParallelResolution& res, int ep_dim, Communicator& ep,
                   Communicator* replicas, Backend& be);
    bool manages(const Parameter* p) const { return owner_.count(p) > 0; }
    bool owns(const std::string& name) const;  // an expert's parameter this rank owns
    // Owned(its owner) for an expert's parameter, Replicate otherwise.
    Placement placement(const Parameter* p) const;
    int mesh_dim() const { return ep_dim_; }
    // The owned experts' gradients: / ep, then averaged over the replicas (once per step); under
    // global_tokens summed over the replicas, undivided.
    void after_backward();

private:
    std::map<const Parameter*, int> owner_;
    std::vector<std::pair<std::string, ParamPtr>> owned_;
    std::set<const Parameter*> wrong_scale_;
    int ep_dim_;
    Communicator& ep_;
    Communicator* replicas_;
    Backend& be_;
    ReduceOp grad_reduce_;
};

}  // namespace ptool
