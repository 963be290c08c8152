// Fault injection: bugs put into a parallel run on purpose (KIND:FQN, FQN * for every place) to
// prove that verify catches and localises them. The CLI reads PTOOL_FAULT and hands the parsed
// fault to verify through VerifyOptions::fault; the engine never reads the environment for it. The
// faults are a RunLayer: they wrap the styles' hooks, the mesh's communicators and the
// data-parallel resolution from outside, so no production path knows about them.
//
// Every kind is one row of kFaultClasses below (its name, its section, what it breaks); the
// message for an unknown kind lists the names from it, and the mutation score
// (tests/mutation_score.py) runs each class over every shipped case it applies to.
#pragma once

#include <optional>
#include <string>

#include "train/run.h"

namespace ptool {

enum class FaultKind {
    // tensor parallel (module FQNs)
    skip_all_reduce,
    bias_every_rank,
    skip_grad_all_reduce,
    wrong_shard_dim,
    wrong_shard_offset,
    wrong_src_rank,
    // data parallel
    skip_bucket,
    grad_sum,
    skip_buffer_broadcast,
    sync_ignored,
    skip_reduce_scatter,
    stale_param,
    skip_replicate_all_reduce,
    zero_skip_gather,
    zero_wrong_group,
    zero_wrong_offset,
    // training configurations
    grad_scale,
    clip_local_norm,
    tied_grad,
    loss_parallel_local,
    dropout_same_mask,
    recompute_mask,
    sac_stale_output,
    loss_per_call,
    grad_norm_per_microbatch,
    // mixed precision
    masters_rounded,
    // float8 (MODULE: a linear the plan's float8 section converts)
    float8_local_amax,
    float8_e4m3_grad,
    float8_scale_unrounded,
    float8_stale_scale,
    float8_master,
    // pipeline parallel (STAGE: a pipeline stage's index, as reports number them: under
    // interleaved_1f1b pp x virtual_stages stages, stage s on pp rank s mod pp, and a fault acts on
    // the stage wherever it runs, not on the rest of its rank)
    pp_loss_unscaled,
    pp_grad_scaled_twice,
    pp_wrong_activation,
    pp_stale_activation,
    pp_detached_input,
    pp_tied_unsynced,
    pp_clip_stage_norm,
    pp_stage_sync_skipped,
    pp_stage_reinit,
    pp_weight_skipped,
    pp_weight_doubled,
    pp_weight_freed_input,
    pp_weight_before_input,
    // context parallel (MODULE: an attention)
    cp_position_offset,
    cp_permutation_kept,
    cp_kv_grads_local,
    cp_grads_unsynced,
    cp_mask_unshifted,
    cp_merge_unscaled,
    cp_ring_stale_kv,
    cp_balance_noncausal,
    // mixture of experts (MODULE: a moe layer)
    moe_router_unnormalised,
    moe_aux_unreduced,
    ep_split_sizes,
    ep_combine_unpermuted,
    ep_expert_misplaced,
    ep_grads_wrong_group,
    ep_shared_unsynced,
    moe_tp_grad_unreduced,
    ep_grad_norm_local,
};

enum class FaultSection {
    tensor_parallel,
    data_parallel,
    training,
    mixed_precision,
    pipeline,
    context,
    experts
};

struct FaultClass {
    FaultKind kind;
    const char* name;  // PTOOL_FAULT's KIND
    FaultSection section;
    const char* target;  // what FQN names
    const char* breaks;  // what the fault does
};

// One row per kind, in the order the names are listed.
inline constexpr FaultClass kFaultClasses[] = {
    {FaultKind::skip_all_reduce, "skip_all_reduce", FaultSection::tensor_parallel, "MODULE",
     "a module's forward reduction of partial sums is skipped (rowwise)"},
    {FaultKind::bias_every_rank, "bias_every_rank", FaultSection::tensor_parallel, "MODULE",
     "rowwise's bias is added by every rank before the reduction"},
    {FaultKind::skip_grad_all_reduce, "skip_grad_all_reduce", FaultSection::tensor_parallel, "MODULE",
     "a module's reduction of its partial input gradient is skipped (colwise)"},
    {FaultKind::wrong_shard_dim, "wrong_shard_dim", FaultSection::tensor_parallel, "MODULE",
     "a sharded parameter is cut along the other dim"},
    {FaultKind::wrong_shard_offset, "wrong_shard_offset", FaultSection::tensor_parallel, "MODULE",
     "a shard is taken one row late (early at the end)"},
    {FaultKind::wrong_src_rank, "wrong_src_rank", FaultSection::tensor_parallel, "MODULE",
     "src_data_rank's broadcast is sent from the next rank"},
    {FaultKind::skip_bucket, "skip_bucket", FaultSection::data_parallel, "PARAM",
     "the bucket holding PARAM is not all_reduced"},
    {FaultKind::grad_sum, "grad_sum", FaultSection::data_parallel, "ROOT",
     "a replicate() root's buckets are summed, not averaged (under global_tokens: averaged, not summed)"},
    {FaultKind::skip_buffer_broadcast, "skip_buffer_broadcast", FaultSection::data_parallel, "*",
     "buffers are not broadcast (at construction, before each forward)"},
    {FaultKind::sync_ignored, "sync_ignored", FaultSection::data_parallel, "*",
     "ignored modules' gradients are averaged anyway"},
    {FaultKind::skip_reduce_scatter, "skip_reduce_scatter", FaultSection::data_parallel, "UNIT",
     "a fully_shard unit's ranks keep their own rows of their own gradient"},
    {FaultKind::stale_param, "stale_param", FaultSection::data_parallel, "UNIT",
     "a fully_shard unit reuses its first all_gather's parameters"},
    {FaultKind::skip_replicate_all_reduce, "skip_replicate_all_reduce", FaultSection::data_parallel, "UNIT",
     "HSDP: a unit's gradient is reduce_scattered over dp_shard but never all_reduced over dp_replicate"},
    {FaultKind::zero_skip_gather, "zero_skip_gather", FaultSection::data_parallel, "ROOT",
     "ZeRO: a replicate() root's updated parameter shards are not all_gathered (each rank keeps its own "
     "update, and the stale parameters of the others' shards)"},
    {FaultKind::zero_wrong_group, "zero_wrong_group", FaultSection::data_parallel, "ROOT",
     "ZeRO: a root's gradient buckets are reduced (stage 1 all_reduce, stage 2 reduce_scatter) over the "
     "wrong group: the tp dim's where it has the dp dim's size, else none (each rank its own)"},
    {FaultKind::zero_wrong_offset, "zero_wrong_offset", FaultSection::data_parallel, "*",
     "ZeRO: dp rank r updates the shard of rank r + 1 (mod dp) and all_gathers it as its own"},
    {FaultKind::grad_scale, "grad_scale", FaultSection::training, "PARAM",
     "the last rank's (of PARAM's pipeline stage) gradient of PARAM is scaled by 1.001 before the sync"},
    {FaultKind::clip_local_norm, "clip_local_norm", FaultSection::training, "*",
     "clip_grad_norm uses each rank's local norm (its all_reduces skipped)"},
    {FaultKind::tied_grad, "tied_grad", FaultSection::training, "MODULE",
     "MODULE's use of its (tied) weight adds nothing to the weight's gradient"},
    {FaultKind::loss_parallel_local, "loss_parallel_local", FaultSection::training, "*",
     "loss_parallel's max and sum-exp all_reduces are skipped"},
    {FaultKind::dropout_same_mask, "dropout_same_mask", FaultSection::training, "MODULE",
     "a dropout draws its mask by local index (every tp rank the same mask)"},
    {FaultKind::recompute_mask, "recompute_mask", FaultSection::training, "MODULE",
     "a dropout's mask in activation checkpointing's recompute is drawn anew"},
    {FaultKind::sac_stale_output, "sac_stale_output", FaultSection::training, "MODULE",
     "a region under the op-level selective policy: the recompute of microbatch m >= 1 takes the "
     "outputs it kept for microbatch m-1"},
    {FaultKind::loss_per_call, "loss_per_call", FaultSection::training, "*",
     "loss_normalization global_tokens run per call: each rank's loss the mean over its own valid targets "
     "divided by the microbatch count, and data parallel averaging the gradients (plain DDP's mean loss, "
     "the bug torchtitan's global_valid_tokens (PRs #1842, #2206) and transformers' num_items_in_batch "
     "fixed)"},
    {FaultKind::grad_norm_per_microbatch, "grad_norm_per_microbatch", FaultSection::training, "*",
     "clip_grad_norm's norm divided by the step's microbatch count: the norm reported and clipped by "
     "(verl #5867, AReaL #1273)"},
    {FaultKind::masters_rounded, "masters_rounded", FaultSection::mixed_precision, "*",
     "the optimizer steps parameters rounded to param_dtype (no fp32 masters)"},
    {FaultKind::float8_local_amax, "float8_local_amax", FaultSection::mixed_precision, "MODULE",
     "a float8 linear scales each rank's piece of a sharded tensor (its weight under tp or under FSDP2's "
     "float8 all-gather, a rowwise input, a colwise output gradient, a sequence-parallel activation) by the "
     "piece's own amax, not the whole tensor's"},
    {FaultKind::float8_e4m3_grad, "float8_e4m3_grad", FaultSection::mixed_precision, "MODULE",
     "a float8 linear casts its output gradient to e4m3fn, the forward's format, instead of e5m2"},
    {FaultKind::float8_scale_unrounded, "float8_scale_unrounded", FaultSection::mixed_precision, "MODULE",
     "a rowwise float8 linear keeps its scales as the amaxes give them, not rounded down to a power of 2 "
     "(torchao's rowwise recipes set round_scales_to_power_of_2)"},
    {FaultKind::float8_stale_scale, "float8_stale_scale", FaultSection::mixed_precision, "MODULE",
     "FSDP2's float8 all-gather with precomputed scales: the linear's weight scale is precomputed before "
     "the optimizer step (the step's old weights'), so the next step's gather casts the updated shards "
     "with it (plans with precompute_float8_dynamic_scale_for_fsdp)"},
    {FaultKind::float8_master, "float8_master", FaultSection::mixed_precision, "MODULE",
     "a float8 linear's master weight is kept in float8: after each optimizer step the rank's weight is "
     "rounded to e4m3fn with its own scale"},
    {FaultKind::pp_loss_unscaled, "pp_loss_unscaled", FaultSection::pipeline, "*",
     "the last stage's microbatch losses are not divided by the step's microbatch count (under "
     "global_tokens, whose sum is divided by the step's count: divided by it again, torch's scale_grads "
     "on a per-token loss)"},
    {FaultKind::pp_grad_scaled_twice, "pp_grad_scaled_twice", FaultSection::pipeline, "STAGE",
     "the stage's gradients are divided by the microbatch count again after the backward (torch's "
     "scale_grads on a loss already divided)"},
    {FaultKind::pp_wrong_activation, "pp_wrong_activation", FaultSection::pipeline, "STAGE",
     "the stage sends microbatch m-1's output as microbatch m's activation (m >= 1; a stage whose next "
     "is on its own rank hands its output on without a send: not hit)"},
    {FaultKind::pp_stale_activation, "pp_stale_activation", FaultSection::pipeline, "STAGE",
     "the stage's backward of microbatch m >= 1 finds microbatch m-1's received input in what its "
     "forward saved (stages > 0)"},
    {FaultKind::pp_detached_input, "pp_detached_input", FaultSection::pipeline, "STAGE",
     "the stage's input is detached: the gradient it sends back to the stage before is zeros (stages > 0 "
     "whose stage before is on another rank)"},
    {FaultKind::pp_tied_unsynced, "pp_tied_unsynced", FaultSection::pipeline, "PARAM",
     "a weight tied across stages of two or more pp ranks: its gradients are not summed over the ranks "
     "that hold it (uses on stages of one rank share its one parameter)"},
    {FaultKind::pp_clip_stage_norm, "pp_clip_stage_norm", FaultSection::pipeline, "*",
     "clip_grad_norm clips each stage by its own gradients' norm (the squares not gathered over pp; "
     "under interleaved_1f1b each pp rank's stages by theirs)"},
    {FaultKind::pp_stage_sync_skipped, "pp_stage_sync_skipped", FaultSection::pipeline, "STAGE",
     "the stage's DDP all_reduces / FSDP reduce_scatters of its gradients are skipped (a bucket or unit "
     "that holds them, whole: under interleaved_1f1b a rank's buckets may hold its other stages' too)"},
    {FaultKind::pp_stage_reinit, "pp_stage_reinit", FaultSection::pipeline, "STAGE",
     "the stage's gradients are zeroed before each microbatch's backward (its W under a split backward: "
     "the stage re-initialised between microbatches, NeMo-Automodel PR #3530): only the step's last "
     "microbatch trains it"},
    {FaultKind::pp_weight_skipped, "pp_weight_skipped", FaultSection::pipeline, "STAGE",
     "a split backward (zero_bubble, zbv, dualpipev) skips the stage's first W of each step: its parameter "
     "gradients miss that microbatch's contribution (its I ran; schedules without a W: not hit)"},
    {FaultKind::pp_weight_doubled, "pp_weight_doubled", FaultSection::pipeline, "STAGE",
     "a split backward adds the stage's first W of each step into its gradients twice (a rank holding two "
     "stages of a V whose chunk's W accumulates into both; schedules without a W: not hit)"},
    {FaultKind::pp_weight_freed_input, "pp_weight_freed_input", FaultSection::pipeline, "STAGE",
     "a split backward's first W of each step on the stage reads the activations its I left as freed "
     "memory (reused before the W: here zeros), its output gradients intact (the first stage, whose W "
     "is its whole backward, and schedules without a W: not hit)"},
    {FaultKind::pp_weight_before_input, "pp_weight_before_input", FaultSection::pipeline, "STAGE",
     "a split backward's order runs the stage's first W of each step just before its I (the action list "
     "of the rank that holds it; schedules without a W: not hit)"},
    {FaultKind::cp_position_offset, "cp_position_offset", FaultSection::context, "MODULE",
     "an attention takes its cp rank's tokens at positions 0..t-1 (no offset): RoPE rotates them and the "
     "causal mask cuts them as the sequence's first tokens"},
    {FaultKind::cp_permutation_kept, "cp_permutation_kept", FaultSection::context, "MODULE",
     "load balancing: an attention's gathered keys and values stay in cp order (the permutation not "
     "inverted) while its mask reads them in position order"},
    {FaultKind::cp_kv_grads_local, "cp_kv_grads_local", FaultSection::context, "MODULE",
     "an attention's key and value gradients are not returned to the cp ranks that hold those positions "
     "(allgather: each keeps its own queries' part of its own keys and values; ring: the last hop is not "
     "taken, each keeps the block it holds)"},
    {FaultKind::cp_grads_unsynced, "cp_grads_unsynced", FaultSection::context, "*",
     "the parameters' gradients are not averaged over cp (each rank steps with its own tokens' gradient)"},
    {FaultKind::cp_mask_unshifted, "cp_mask_unshifted", FaultSection::context, "MODULE",
     "ring (rotate_method alltoall): an attention masks every block that comes round the ring as its own "
     "(the causal mask not shifted to the block's positions)"},
    {FaultKind::cp_merge_unscaled, "cp_merge_unscaled", FaultSection::context, "MODULE",
     "ring: an attention merges the blocks' partial softmaxes without the max (each block's sum of "
     "exp(s - its own max) added as if the maxima were equal)"},
    {FaultKind::cp_ring_stale_kv, "cp_ring_stale_kv", FaultSection::context, "MODULE",
     "ring: an attention's backward recomputes every ring step with its own keys and values, not the "
     "block that came round (the gradients still travel with their block; diffusers #14265)"},
    {FaultKind::cp_balance_noncausal, "cp_balance_noncausal", FaultSection::context, "MODULE",
     "load balancing: a non-causal attention's blocks masked as a causal one's (the load balancer's "
     "causal layout applied to a bidirectional mask, pytorch#141429)"},
    {FaultKind::moe_router_unnormalised, "moe_router_unnormalised", FaultSection::experts, "MODULE",
     "a mixture of experts' router gets norm_topk_prob wrong: each token's top-k weights renormalised where "
     "the model says not, or left as scored where it says renormalise (forward and backward)"},
    {FaultKind::moe_aux_unreduced, "moe_aux_unreduced", FaultSection::experts, "MODULE",
     "a mixture of experts' load-balancing loss computed per rank without its reduction: each rank's share "
     "of the slots and mean scores from its own tokens, its gradient not scaled for data parallel's average"},
    {FaultKind::ep_split_sizes, "ep_split_sizes", FaultSection::experts, "MODULE",
     "expert parallel: the dispatch's split sizes off by one row, so the last row a rank sends to ep rank 0 "
     "is "
     "counted as ep rank 1's first expert's (computed by the wrong expert)"},
    {FaultKind::ep_combine_unpermuted, "ep_combine_unpermuted", FaultSection::experts, "MODULE",
     "expert parallel: the combine puts the returned rows back in token order, without inverting the "
     "dispatch's sort by expert"},
    {FaultKind::ep_expert_misplaced, "ep_expert_misplaced", FaultSection::experts, "MODULE",
     "expert parallel: each ep rank's experts' rows go to the rank before it, which computes them with its "
     "own "
     "experts' weights (an expert on the wrong rank)"},
    {FaultKind::ep_grads_wrong_group, "ep_grads_wrong_group", FaultSection::experts, "MODULE",
     "expert parallel: the experts' gradients scaled for the other normalisation: under mean_per_call not "
     "divided by ep (the ep ranks' contributions summed: doubled at ep 2, pytorch#160285, Megatron PR "
     "#5956), under global_tokens divided by it"},
    {FaultKind::ep_shared_unsynced, "ep_shared_unsynced", FaultSection::experts, "MODULE",
     "expert parallel: a moe layer's shared expert left out of data parallel's gradient sync (taken for an "
     "expert whose gradient expert parallelism handles)"},
    {FaultKind::moe_tp_grad_unreduced, "moe_tp_grad_unreduced", FaultSection::experts, "MODULE",
     "tensor parallel without expert parallel: the gradient a moe layer's experts send back to the "
     "layer's input is not all_reduced over tp (each rank keeps its share), so the router and everything "
     "below get under-reduced gradients (torchtitan PR #4054)"},
    {FaultKind::ep_grad_norm_local, "ep_grad_norm_local", FaultSection::experts, "*",
     "expert parallel: clip_grad_norm sums each rank's own experts' squares only (not over ep): the norm "
     "undercounted and clipped by (Megatron PR #5916)"},
};

const FaultClass& fault_class(FaultKind k);
const char* fault_section_name(FaultSection s);  // "tensor parallel", ...

struct Fault {
    std::optional<FaultKind> kind;  // none: no fault
    std::string fqn;                // where: a module, parameter, unit or root's FQN, or * for every place
    bool empty() const { return !kind; }
    bool is(FaultKind k) const { return kind == k; }
    bool hits(FaultKind k, const std::string& where) const {
        return kind == k && (fqn == "*" || fqn == where);
    }
    bool hits_stage(FaultKind k, int stage) const {  // a pipeline stage's (stage -1: no pipeline)
        return stage >= 0 && hits(k, std::to_string(stage));
    }
};

// "" or null: no fault; anything but KIND:FQN with a known KIND is an InputError listing the kinds.
Fault parse_fault(const char* text);

// InputError where the fault's FQN names no place of its kind (kFaultClasses' target: a module, a
// parameter, a stage of the plan's pipeline) in `model` and `plan`: a typo would break nothing and
// the run would pass as if verify had missed the fault. `*`, a kind whose target is `*` (its FQN
// unread) and no fault pass.
void check_fault_target(const Fault& f, const Model& model, const Plan& plan);

// The layer that injects `fault` into a run (null for no fault).
std::unique_ptr<RunLayer> fault_layer(const Fault& fault);

}  // namespace ptool
