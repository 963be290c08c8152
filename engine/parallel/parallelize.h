// parallelize_module for ptool. resolve_plan matches the plan's patterns against the model and
// lints it (no communication, no tensor): each style checks the modules it is given, and the
// layout pass follows every activation's placement through the step. parallelize then, on each
// rank, distributes the styled modules' parameters and installs the styles' hooks.
#pragma once

#include <set>

#include "model/float8_linear.h"
#include "parallel/activation_checkpointing.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/layout_pass.h"

namespace ptool {

struct Resolution {
    std::vector<ResolvedStyle> styles;      // in forward registration order
    std::vector<Diagnostic> warnings;       // plan.yaml:6:3 "pattern 'x' matched no module", ...
    int tp = 1;                             // ranks of the tensor-parallel dim
    Placement input_placement;              // how the model input reaches the ranks
    LayoutReport layouts;                   // every module call's layouts and the step's collectives
    DataParallelResolution dp;              // the data_parallel section, resolved
    ExpertParallelResolution ep;            // the expert_parallel section, resolved
    ActivationCheckpointing checkpointing;  // activation_checkpointing's modules
    // The float8 section's linears (parallel/float8_training.h), in module order, each with its
    // recipe and the tp pieces its scales cover; Run::Run swaps them in (apply_float8).
    std::vector<std::pair<const Module*, Float8Gemms>> float8;
    // Findings that make a mismatch with the reference expected, shown with a failing verdict as
    // its cause ("loss: sum under data parallel ...", BatchNorm with local statistics).
    std::vector<Diagnostic> causes;

    const ResolvedStyle* style_of(const Module& m) const;  // null: unstyled
    // The same resolution for `to`, a model built from the same text as `from` (the model it was
    // resolved against; each rank builds its own): every module pointer translated by walking both
    // trees together, every call's style pointing into the copy's styles (a plain copy would point
    // into this one's). Refuses models whose module trees differ (names, types, parameter shapes,
    // dtypes) with an internal error (PTOOL_REQUIRE). parallel/resolution_rebind.cpp.
    Resolution rebound(const Model& from, const Model& to) const;
};

// A plan resolved once, against one model of the job's text (verify's probe, explain's model):
// every rank's Run, and a simulation, rebinds it to its own model instead of resolving again.
struct ResolvedPlan {
    const Plan* plan = nullptr;  // the plan it was resolved for (its entries point into it)
    const Model* model = nullptr;
    const Resolution* resolution = nullptr;
};

// Errors (exit 2) for styles on modules they cannot apply to, overlapping patterns, layout
// conflicts; warnings for patterns matching nothing, an empty plan, uneven shards, parameters
// whose gradients stay partial. The model need not be initialised.
Resolution resolve_plan(const Model& model, const Plan& plan);
// Test hook: how many times resolve_plan has run in this process, every thread's (a verify
// resolves each plan once: tests/test_resolve_once.cpp counts it).
int64_t resolve_plan_count();

// A distributed parameter's placement on the tensor-parallel dim and its full shape.
struct TpParam {
    Placement placement;
    Shape global;
};
using TpParams = std::map<const Parameter*, TpParam>;

// Distributes the styled modules' parameters on this rank (src_data_rank's broadcast, counted
// under the module's name, then the rank's chunk; or, with build_own_shards, each rank draws only
// its own piece from the counter-based RNG: no communication, no full tensor) and installs the
// styles' hooks. Returns the distributed parameters.
TpParams parallelize(Model& model, const Plan& plan, const Resolution& res, DeviceMesh& mesh,
                     bool build_own_shards = false);

// Whether a style cuts one of a module's parameters: its rank then builds that module's
// parameters itself under src_data_rank: null (the model's init leaves the module out).
bool builds_own_pieces(const ResolvedStyle& rs);
// Whether the style distributes every parameter the module owns (so with src_data_rank all of them
// come from the source rank's broadcast).
bool distributes_all_own(const ResolvedStyle& rs);

}  // namespace ptool
