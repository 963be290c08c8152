// Float8 training as torchtitan's float8 converter configures it (issue 48; docs/float8.md): the
// plan's `float8` section swaps the model's linears for torchao's Float8Linear before anything is
// parallelised (model/float8_linear.h runs their GEMMs).
//
//   float8:
//     recipe: tensorwise        # torchao's recipe (rowwise: not built yet)
//     filter_fqns: [output]     # linears whose name contains one of these keep their dtype
//     enable_fsdp_float8_all_gather: true               # fully_shard gathers the weights in float8
//     precompute_float8_dynamic_scale_for_fsdp: true    # their scales after the optimizer step
//
// Converted: every linear whose fqn contains none of filter_fqns (torchtitan's substring test)
// and whose in and out features are multiples of 16 (module_filter_fn: float8 tensor cores), but
// a moe layer's routed experts (torchao converts them as grouped GEMMs, which ptool has not built).
// Without filter_fqns the model's output head, its last linear, keeps its dtype (torchtitan's
// Llama configs say filter_fqns = ["output"]; ptool's models name their heads otherwise too).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/yaml_reader.h"
#include "model/float8_linear.h"
#include "model/module.h"

namespace ptool {

class Model;
struct DataParallelResolution;
struct Plan;
struct Resolution;

struct Float8Spec {
    SourceLocation where;
    Float8Recipe recipe;
    std::optional<std::vector<std::string>> filter_fqns;  // nullopt: the output head
    // FSDP2's float8 all-gather (torchao's WeightWithDynamicFloat8CastTensor): fully_shard casts a
    // float8 linear's weight shard with the whole weight's scale and gathers the codes, one byte an
    // element (parallel/fully_shard.h); the linear's GEMMs take them as gathered. Nothing without
    // fully_shard, as torchtitan turns it off where dp_shard is 1.
    bool fsdp_float8_all_gather = false;
    // torchao's precompute_float8_dynamic_scale_for_fsdp, run after each optimizer step (torchtitan's
    // post-optimizer hook): the next step's all-gather scales from the updated shards, every weight's
    // amax in one all_reduce, where each gather would otherwise all_reduce its own.
    bool precompute_scale = false;
    // The ranks whose rows a forward holds, each scaled apart: its own on a rank; verify's reference
    // on one device takes the plan's data ranks and cp ranks (reference_plan).
    Float8RowGroups row_groups;
    // The reference of a plan whose fully_shard gathers its float8 weights in float8
    // (float8_all_gathers): that plan's fully_shard units, as their FQN patterns ("" the root), whose
    // float8 weights' compute copies are their masters' float8 codes (MixedPrecision), as torchao's
    // pre-all-gather casts the master shards, not their param_dtype copies. Set by reference_plan
    // (a plan's own run gathers them so); empty: none.
    std::vector<std::string> weights_from_masters;
};

Float8Spec parse_float8(const YamlNode& node);

// Whether fully_shard gathers the float8 weights in float8 under `plan`: the section asks for it
// and fully_shard shards over more than one rank (FSDP2 gathers nothing at one).
// DataParallel gives fully_shard the float8 all-gather by it, and explain says so by it.
bool float8_all_gathers(const Plan& plan, const DataParallelResolution& dp);
// The same from the plan alone: it names fully_shard units (mode fully_shard's root, or patterns).
bool float8_all_gathers(const Plan& plan);
// The float8 linear whose weight the parameter named `param` is, by name (`OWNER.weight`, OWNER a
// float8 linear of `modules`, by FQN), else null: how fully_shard picks the weights it gathers in
// float8, and the reference of such a plan the weights it casts from their masters.
Module* float8_linear_of(const std::string& param, const std::map<std::string, Module*>& modules);

// The selected linears (see above) in module order, each with the recipe and the pieces tensor
// parallelism cuts of what its GEMMs see (from its style's rule and the layout pass's calls):
// resolve_plan's `float8`, made once. An empty selection is exit 2 at the section (the plan would
// not run in float8), as rowwise under tensor parallelism (not built).
std::vector<std::pair<const Module*, Float8Gemms>> resolve_float8(const Model& model, const Float8Spec& spec,
                                                                  const Resolution& res);
// Swaps the resolution's float8 linears in: `model` is the one the resolution was made or rebound
// against.
void apply_float8(Model& model, const Resolution& res);
// Their fqns, in module order.
std::vector<std::string> float8_linears(const Resolution& res);

}  // namespace ptool
