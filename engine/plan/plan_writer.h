// Writing a plan for a model from its module tree, as torchtitan writes Llama's by hand: the
// tensor-parallel plan with sequence parallelism where the model has a sequence (token input), the
// data-parallel section (one dp dim, or HSDP's [dp_replicate, dp_shard]), activation
// checkpointing, the gradient accumulation it was chosen with where that is not the model's, and
// torchao's float8 with torch.compile where chosen; as plan YAML text that load_plan_text reads.
//
// The tensor-parallel rules follow the activation's layout through the modules in forward order
// (Replicate, Shard(1) = sequence shards, Shard(-1) = a colwise linear's feature shards). Each
// module type names the rule it follows (TpRule, model/module_type.h); by the types that use them:
//   embedding on replicated ids        rowwise, output Shard(1) (the sequence)
//   layer_norm, rms_norm on Shard(1)   sequence_parallel
//   attention, gated_mlp               prepare_input Shard(1) -> Replicate; q/k/v (gate/up) colwise;
//                                      o (down) rowwise, output Shard(1)
//   linear, not the last module        colwise (input Shard(1) gathered): Shard(-1)
//   linear on Shard(-1)                rowwise, output Shard(1) (or Replicate without a sequence)
//   the last linear                    on Shard(-1): rowwise (the pair's second), output Replicate;
//                                      else colwise, output Shard(-1) kept sharded: loss_parallel under
//                                      cross_entropy, else gathered to Replicate
//   dropout, activations               follow their input
//   position_embedding                 needs whole sequences: the model gets no sequence parallelism
//   residual                           its body must end in the layout it started in
// A repeat is written once with '*' for its index. A model with batch_norm gets sync_batch_norm:
// true under data parallelism (the reference's statistics). Any other module (batch_norm, a norm on feature
// shards) has no rule: the model gets no tensor-parallel plan and the planner says why.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "model/float8_linear.h"
#include "model/model.h"
#include "parallel/plan.h"

namespace ptool {

struct TensorParallelTemplate {
    std::vector<std::pair<std::string, std::string>> entries;  // pattern -> style (YAML flow text)
    bool loss_parallel = false;
    bool sequence_parallel = false;
    std::string unsupported;  // why the model has no plan ("" when it has one)
};
TensorParallelTemplate tensor_parallel_template(const Model& model);

// Patterns of each repeat's elements ("layers.*"): fully_shard units and checkpointed modules.
std::vector<std::string> repeated_blocks(const Model& model);

// What every plan written for a model takes from its module tree, read once (a planner writes
// hundreds of plans for one model, and walking its tree for each was a fortieth of its time).
struct PlanTemplate {
    TensorParallelTemplate tp;
    std::vector<std::string> blocks;  // repeated_blocks
    bool batch_norm = false;          // a module keeps batch statistics: sync_batch_norm
    DType dtype = DType::float32;     // the model's: mixed precision's reduce_dtype
};
PlanTemplate plan_template(const Model& model);

struct PlanChoice {
    int dp = 1, tp = 1;
    // Context parallel (cp > 1): the sequence over cp ranks between dp and tp on the mesh
    // (torchtitan's order), load-balanced, keys and values all-gathered; fully_shard over dp x cp
    int cp = 1;
    DataParallelMode dp_mode = DataParallelMode::fully_shard;
    // HSDP (fully_shard on [dp_replicate, dp_shard]): the dp ranks as dp / dp_shard replicas of
    // dp_shard shards; 0: one dp dim
    int dp_shard = 0;
    bool checkpoint = false;                 // activation checkpointing of repeated_blocks
    bool selective = false;                  // with checkpoint: the op-level policy (mode: op), else full
    std::optional<std::string> param_dtype;  // mixed precision (reduce in the model's dtype)
    // Pipeline parallel (pp > 1): pp ranks outermost on the mesh (the dim that crosses nodes), the
    // schedule, virtual stages per rank, microbatches per round, and the repeat's blocks per stage
    // (stage_blocks: the first stage also runs what comes before the blocks, the last what comes
    // after; empty: layers_per_stage evenly)
    int pp = 1;
    ScheduleKind schedule = ScheduleKind::one_f_one_b;
    int virtual_stages = 1;
    int pp_microbatches = 0;
    std::vector<int> stage_blocks;
    std::string repeat;  // the repeat whose blocks the stages split ("layers")
    // The step's rounds of gradient accumulation the plan carries (its top-level
    // gradient_accumulation, over the model's); 0: none written, the model's
    int gradient_accumulation = 0;
    // replicate only: data_parallel's zero_stage (1 optimizer state sharded, 2 gradients too)
    int zero_stage = 0;
    // Expert parallel (> 1: a model with experts): the experts split over the dp dim (HSDP's
    // dp_shard, or its dp_replicate with ep_replicate), which expert_parallel borrows; ep is that
    // dim's size
    int ep = 1;
    // HSDP only: ep borrows dp_replicate and fully_shard shards each rank's experts over dp_shard
    // (torchtitan's fully_shard of the experts over the ranks that hold the same ones)
    bool ep_replicate = false;
    // with ep_replicate: the mesh puts dp_replicate inner (ep's blocking all_to_all inside a node, as
    // torchtitan's dp_shard_in_ep; fully_shard's collectives across nodes), else outer (HSDP's order)
    bool ep_inner = false;
    // torchao's float8 training (docs/float8.md): none, else the recipe of a `float8` section as
    // torchtitan's converter writes it (no filter_fqns: the output head left out), with `compile: true`
    std::optional<Float8Scaling> float8;

    bool hybrid() const { return dp_shard > 1 && dp_shard < dp; }
    // "full", "op" (activation_checkpointing's modes) or "" (none)
    const char* checkpoint_mode() const { return !checkpoint ? "" : selective ? "op" : "full"; }
    bool same_checkpointing(const PlanChoice& o) const {
        return checkpoint == o.checkpoint && selective == o.selective;
    }
    int dp_replicate() const { return hybrid() ? dp / dp_shard : 1; }
    // the float8 section's FSDP2 all-gather (and its precomputed scales), as torchtitan's published
    // float8 runs: tensorwise under fully_shard over more than one rank of the dp shard dim
    // (torchtitan turns it off where dp_shard is 1)
    bool float8_all_gather() const {
        return float8 == Float8Scaling::tensorwise && dp_mode == DataParallelMode::fully_shard &&
               (hybrid() ? dp_shard : dp) > 1;
    }
    std::string float8_text() const {  // "" or " float8 tensorwise": the search's shapes name it
        return float8 ? std::string(" float8 ") + float8_scaling_name(*float8) : "";
    }
    // the data dim expert_parallel borrows (ep > 1): "dp", HSDP's "dp_shard" or "dp_replicate"
    const char* ep_mesh_dim() const { return !hybrid() ? "dp" : ep_replicate ? "dp_replicate" : "dp_shard"; }
    std::string mode_name() const {
        const std::string m = hybrid()     ? "hsdp"
                              : zero_stage ? fmt::format("zero{}", zero_stage)
                                           : data_parallel_mode_name(dp_mode);
        return ep > 1 ? fmt::format("{}+ep{}{}", m, ep, !ep_replicate ? "" : ep_inner ? "r-inner" : "r") : m;
    }  // "hsdp", "fully_shard", "replicate", "zero1", "zero2"; "+epN" with expert parallel ("+epNr": over
       // HSDP's dp_replicate, the experts sharded over dp_shard; "+epNr-inner": dp_replicate the inner dim)
    std::string dp_text() const {  // "dp8", or HSDP's "dp2x4" (replicas x shards)
        return hybrid() ? fmt::format("dp{}x{}", dp_replicate(), dp_shard) : fmt::format("dp{}", dp);
    }
    std::string mesh_text() const {  // "dp8 x tp8", "pp8 x dp2x4 x tp2", "dp2 x cp4 x tp1"
        const std::string inner = cp > 1 ? fmt::format("{} x cp{} x tp{}", dp_text(), cp, tp)
                                         : fmt::format("{} x tp{}", dp_text(), tp);
        return pp > 1 ? fmt::format("pp{} x {}", pp, inner) : inner;
    }
    std::string pp_text() const {  // "-", or "pp8 1f1b m32", "pp8 interleaved_1f1b v2 m32"
        if (pp <= 1) return "-";
        return virtual_stages > 1
                   ? fmt::format("pp{} {} v{} m{}", pp, schedule_kind_name(schedule), virtual_stages,
                                 pp_microbatches)
                   : fmt::format("pp{} {} m{}", pp, schedule_kind_name(schedule), pp_microbatches);
    }
};
// The plan's YAML text (without comments).
std::string write_plan(const PlanTemplate& model, const PlanChoice& c);

}  // namespace ptool
