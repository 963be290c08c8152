// parallelize_module for ptool: resolve the plan's patterns against the model (no communication;
// the lint findings of DESIGN §6 that need no run), then, on each rank, shard the matched modules'
// parameters and install their style hooks.
#pragma once

#include "parallel/data_parallel.h"
#include "parallel/tp_styles.h"

namespace ptool {

struct ResolvedStyle {
    std::string fqn;
    Module* module = nullptr;
    const PlanEntry* entry = nullptr;
};

struct Resolution {
    std::vector<ResolvedStyle> styles;     // in forward registration order
    std::vector<std::string> warnings;     // "plan.yaml:6:3: pattern 'x' matched no module", ...
    Placement input_placement;             // how the model input reaches the ranks
    DataParallelResolution dp;             // the data_parallel section, resolved
    // Findings that make a mismatch with the reference expected, shown with a failing verdict as
    // its cause ("loss: sum under data parallel ...", BatchNorm with local statistics).
    std::vector<std::string> causes;
};

// Errors (exit 2) for styles on modules they cannot apply to, overlapping patterns, tied weights
// under colwise/rowwise; warnings for patterns matching nothing, an empty plan, uneven shards,
// sharded activations fed to modules that need them whole, dropout on sharded activations.
Resolution resolve_plan(const Model& model, const Plan& plan);

// Shards the parameters of the resolved modules on this rank (broadcast from src_data_rank first,
// counted under the module's name, or no communication when it is null) and installs the hooks.
// build_own_shards: the styled modules' parameters were never initialised; each rank draws only
// its own shard from the counter-based RNG (src_data_rank: null), never touching the full tensors.
void parallelize(Model& model, const Plan& plan, const Resolution& res, DeviceMesh& mesh,
                 const std::shared_ptr<TpState>& state, bool build_own_shards = false);

// Whether a module's parameters are sharded by the plan (colwise / rowwise).
bool shards_parameters(const Resolution& res, const Module& m);

}  // namespace ptool
