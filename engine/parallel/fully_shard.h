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
#include <string>
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

class FullyShard {
public:
    // Shards every unit's parameters on this rank (no communication) and installs the hooks.
    // mp: mixed precision (FSDP2's MixedPrecisionPolicy): gathers in param_dtype, reduce_scatters in
    // reduce_dtype, the shards (the optimizer's masters) keep the model's dtype. Null: none.
    // replicas: HSDP's replicate dim (null: none). grad_reduce: how the ranks' gradients combine in
    // the reduce_scatter and HSDP's all_reduce (avg, or sum: gradient_divide_factor 1).
    FullyShard(Model& model, const std::vector<FsdpUnitSpec>& units, Communicator& dp, Communicator* replicas,
               Backend& be, const struct MixedPrecisionSpec* mp = nullptr,
               ReduceOp grad_reduce = ReduceOp::avg, bool accumulate = false);
    bool manages(const Parameter* p) const;
    // accumulate (torch.distributed.pipelining's FSDP2 under a split backward): each unit's
    // backwards sum into one unsharded gradient (in reduce_dtype), which this reduce_scatters into
    // the shards and frees, in the units' order (the stage's last backward's run_post_backward).
    // Nothing otherwise: each backward reduced its own.
    void finish_backward();

    struct State;

private:
    std::vector<std::shared_ptr<State>> units_;
};

}  // namespace ptool
