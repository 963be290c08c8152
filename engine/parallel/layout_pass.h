// The layout pass: the static walk of one training step under a plan, with no tensor allocated.
// It follows the model's forward (Module::layout) from the input's layout, applies each styled
// module's rule (parallel/style.h), and records every module call's input and output layout and
// every collective of the step with its bytes: the styles' redistributions, their parameter
// gradient reductions, and the gather of the output for the loss. It is
//   - the lint: a layout a module cannot take (a sharded last dim into a plain linear, a
//     sequence-sharded activation where a style declares Replicate, attention heads that do not
//     divide) is exit 2 at the plan entry, with the fix;
//   - explain's shapes, placements and collectives (checked against what verify measures);
//   - what the planner costs.
#pragma once

#include <map>
#include <set>

#include "parallel/redistribute.h"
#include "parallel/style.h"

namespace ptool {

struct PlanEntry;

// A styled module as the plan resolved it.
struct ResolvedStyle {
    std::string fqn;
    Module* module = nullptr;
    const PlanEntry* entry = nullptr;
};

struct CallLayout {
    const Module* module = nullptr;
    std::string fqn;
    const ResolvedStyle* style = nullptr;  // null: the module runs unstyled
    Layout in, out;                        // as its caller hands and receives them
    int depth = 0;                         // 0: the root
};

struct LayoutReport {
    std::vector<CallLayout> calls;  // every module call, in forward order (a container before its children)
    Layout input, output;           // the model's, on one dp rank's rows
    std::vector<CommCost> forward, backward;  // the step's collectives in the order they run
    std::vector<Diagnostic> warnings;
};

struct LayoutPassOptions {
    bool loss_parallel =
        false;  // cross_entropy on the sharded output (its collectives) instead of gathering it
    std::set<const Module*>
        checkpointed;              // modules whose forward (its collectives included) runs again in backward
    std::optional<DType> compute;  // mixed precision's param_dtype: what activations and gradients travel in
};

// input: the model input's layout; `styles` by module. Throws InputError (exit 2) on a conflict.
LayoutReport propagate_layouts(const Model& model,
                               const std::map<const Module*, const ResolvedStyle*>& styles,
                               const Layout& input, int parts, const SourceLocation& plan_where,
                               const LayoutPassOptions& options = {});

}  // namespace ptool
