// fully_shard (FSDP2 / ZeRO-3) as module hooks. Each unit's parameters (its subtree's, less those
// of inner units) are Shard(0) on the dp dim, torch.chunk-sized (uneven sizes padded in the flat
// buffers, as FSDP2 pads). Per unit and step:
//   pre_forward   all_gather of the unit's shards (one flat collective) -> full parameters
//   post_forward  reshard (drop the full parameters); the root unit keeps them, as FSDP2's root
//   backward      all_gather again when resharded, full-size gradients
//   post_backward reduce_scatter(avg) of the full gradients into the local shards (HSDP: then their
//                 all_reduce(avg) over the replicate dim), reshard. Under a split-backward pipeline
//                 schedule (zero_bubble, zbv, dualpipev) the backwards accumulate into one unsharded
//                 gradient instead, reduced once at the step's gradient sync (finish_backward), as
//                 torch.distributed.pipelining drives FSDP2 (its backward_maybe_with_nosync)
// The optimizer then steps on the shards, so its state is sharded too. The collectives run under
// the unit's FQN as the counter's module, with site "unshard" and "reduce_grads".
#pragma once

#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "comm/communicator.h"
#include "model/model.h"

namespace ptool {

struct FsdpUnitSpec {
    std::string fqn;                  // the unit module ("" is the root)
    std::vector<std::string> params;  // FQNs it manages
    // One moe layer's experts (fqn: its `experts` container) under expert parallel over another data
    // dim than the one fully_shard shards on, as torchtitan's fully_shard of each block's experts
    // over dp_mod_ep: hooked on the moe layer (which calls them); each rank shards the experts it
    // owns (Run drops the others' names), and their reduce_scatter's result is not averaged over
    // HSDP's replicate dim, which is the ep dim here (parallel/expert_parallel.h divides by ep).
    bool experts = false;
    // the module its hooks go on: the unit's own, or an experts unit's moe layer
    std::string hooked_on() const { return experts ? fqn.substr(0, fqn.rfind('.')) : fqn; }
};

// FSDP2's float8 all-gather (the plan's float8 section, enable_fsdp_float8_all_gather; torchao's
// WeightWithDynamicFloat8CastTensor): each float8 linear's weight shard is cast to float8 with the
// whole weight's scale before the all-gather (its amax: the shards' max over the shard group, and
// over tp where tp cuts the weight; or precompute_float8_scales's), so the gather moves one byte
// an element (a unit whose other parameters are not float8 gathers them in one uint8 buffer, as
// FSDP2 does for mixed dtypes) and the unsharded weight is the codes with their scale
// (Parameter::float8_scale), which the linear's GEMMs take as they are. Numerically the cast of the
// gathered whole with its own amax: the same numbers as gathering first.
struct FsdpFloat8 {
    Communicator* tp = nullptr;  // tensor parallel's group, where it cuts a weight
    // Weights whose precomputed scale is the one their last gather used (precompute run before the
    // optimizer step): empty but under fault injection (verify/faults.h, float8_stale_scale).
    std::set<std::string> stale_scales;
};

class FullyShard {
public:
    // Shards every unit's parameters on this rank (no communication) and installs the hooks.
    // mp: mixed precision (FSDP2's MixedPrecisionPolicy): gathers in param_dtype, reduce_scatters in
    // reduce_dtype, the shards (the optimizer's masters) keep the model's dtype. Null: none.
    // replicas: HSDP's replicate dim (null: none). grad_reduce: how the ranks' gradients combine in
    // the reduce_scatter and HSDP's all_reduce (avg, or sum: gradient_divide_factor 1).
    FullyShard(Model& model, const std::vector<FsdpUnitSpec>& units, Communicator& dp, Communicator* replicas,
               Backend& be, const struct MixedPrecisionSpec* mp = nullptr,
               ReduceOp grad_reduce = ReduceOp::avg, bool accumulate = false,
               const FsdpFloat8* float8 = nullptr);
    bool manages(const Parameter* p) const;
    // torchao's precompute_float8_dynamic_scale_for_fsdp (after the optimizer step): every float8
    // weight's scale for the next gathers from its shards as they are now, the amaxes stacked in
    // one all_reduce over the shard group (and one over tp where tp cuts some). Nothing without
    // the float8 all-gather.
    void precompute_float8_scales();
    // accumulate (torch.distributed.pipelining's FSDP2 under a split backward): each unit's
    // backwards sum into one unsharded gradient (in reduce_dtype), which this reduce_scatters into
    // the shards and frees, in the units' order (the stage's last backward's run_post_backward).
    // Nothing otherwise: each backward reduced its own.
    void finish_backward();

    struct State;

private:
    std::vector<std::shared_ptr<State>> units_;
    // every unit's parameters: manages() was a walk of them all, asked of each parameter (quadratic
    // in the blocks: 6% of explain's simulation of a 126-block model)
    std::unordered_set<const Parameter*> managed_;
};

}  // namespace ptool
