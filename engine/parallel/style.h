// A tensor-parallel style (PyTorch's ParallelStyle: ColwiseParallel, RowwiseParallel,
// SequenceParallel, PrepareModuleInput/Output) is one object, in one file under parallel/styles/,
// registered by name. It owns everything about itself:
//   - its options in the plan YAML (parse) and the module types it applies to (the lint);
//   - which of the module's parameters it distributes, and how they are placed (params);
//   - its static rule (rule, grad_syncs): the placement the module's input is redistributed to,
//     what the module's own compute then produces, where its output is redistributed to, the
//     gradients' way back, and which parameter gradients are partial sums to reduce. The layout
//     pass (parallel/layout_pass.h) derives shapes, placements and collectives from the rule with
//     no tensor allocated; the runtime hooks (StyleHooks, below) execute the same rule;
//   - the runtime extras its rule cannot say (rowwise adds its bias after the reduction).
// parallelize, the lint, explain and the runner all ask the style; nothing mirrors it.
// docs/adding_a_style.md walks through adding one.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/diagnostic.h"
#include "core/yaml_reader.h"
#include "model/model.h"
#include "parallel/style_names.h"

namespace ptool {

class Style;

// A style as a plan entry gives it: the style and PyTorch's layout options (each style reads the
// ones it has).
struct StyleSpec {
    const Style* style = nullptr;
    std::optional<Placement> input_layouts, output_layouts, desired_input_layouts, desired_output_layouts;
    bool use_local_output = true;
    // colwise `save_input: shard` (Megatron's sequence parallelism): the linear's backward gets its
    // input by all-gathering this rank's shard again instead of keeping the gathered input
    // (PyTorch's DTensor keeps it: `save_input: gathered`, the default).
    bool save_input_shard = false;
    std::string_view name() const;
};

struct Redistribution {
    Placement from, to;
};

// What a style does around one call of its module.
struct StyleRule {
    std::optional<Redistribution>
        pre;  // the input: from the declared placement to what the module computes on
    std::optional<Placement> compute_out;  // the module's own output, where the style's sharding changes it
    std::optional<Placement> grad_in;      // the input gradient as the module's backward leaves it
    std::optional<Redistribution>
        post;  // the output: from what the module computed to the declared placement
};

// A parameter the style distributes (PyTorch's distribute_tensor: sent from src_data_rank, or
// drawn by each rank for its own piece) and its placement on the tensor-parallel dim.
struct ParamPlacement {
    std::string param;  // the module's local name: "weight"
    Placement placement;
};

// A parameter gradient that one call leaves on each rank as a partial sum or a shard of the
// replicated gradient, and that the style reduces to Replicate after the call's backward.
struct ParamGradSync {
    std::string param;
    Placement from;
};

// What a style's lint sees of one styled module.
struct StyleCheck {
    const Model& model;
    const Module& module;
    const std::string& pattern;
    const SourceLocation& where;  // the plan entry
    int parts;                    // ranks of the tensor-parallel dim
    std::vector<Diagnostic>& warnings;
    const StyleSpec& spec;  // the entry's options
};

class Style {
public:
    virtual ~Style() = default;
    virtual std::string_view name() const = 0;
    // The lint: whether it applies to the module, and the types it applies to for the message.
    virtual bool applies_to(const Module& m) const = 0;
    virtual std::string_view applies_to_text() const = 0;  // "linear and embedding modules"
    // Reads the style's options from its plan entry (a map; `node` for messages).
    virtual void parse(YamlMap& m, const YamlNode& node, StyleSpec& s) const = 0;
    // Further lint of a module it applies to: errors throw InputError at c.where; warnings are added.
    virtual void check(const StyleCheck&) const {}

    virtual std::vector<ParamPlacement> params(const Module&) const { return {}; }
    virtual StyleRule rule(const Module& m, const StyleSpec& s) const = 0;
    // The parameter gradients a call leaves partial; `out` is the call's (declared) output layout.
    virtual std::vector<ParamGradSync> grad_syncs(const Module&, const StyleSpec&,
                                                  const Layout& /*out*/) const {
        return {};
    }

    // Runtime: sets up the module on tp rank `rank` of `parts` (after its parameters are sharded)
    // and returns the hooks that run the rule.
    virtual std::shared_ptr<ModuleHooks> install(Module& m, const StyleSpec& s, Communicator& tp) const;
};

// The registry: every style file registers its object at start-up (PTOOL_REGISTER_STYLE).
const Style* find_style(std::string_view name);
std::vector<std::string> style_names();
bool register_style(std::unique_ptr<Style> style);
#define PTOOL_REGISTER_STYLE(Type) \
    static const bool ptool_style_registered_##Type = ::ptool::register_style(std::make_unique<Type>())

// The layout options every style reads the same way ("input_layouts: shard(1)").
std::optional<Placement> parse_layout_key(YamlMap& m, const char* key);

// Runs a style's rule around its module: redistributes the input (pre), reads the module's output
// and input gradient as the rule says, redistributes the output (post) and the gradients back, and
// reduces the parameter gradients the rule lists. Styles with runtime extras derive from it.
class StyleHooks : public ModuleHooks {
public:
    StyleHooks(const Module& m, const StyleSpec& s, Communicator& tp);
    Placed pre_forward(RunContext& ctx, Module& m, const Placed& x) override;
    Placed post_forward(RunContext& ctx, Module& m, const Placed& y) override;
    Placed post_forward_backward(RunContext& ctx, Module& m, const Placed& dy) override;
    Placed pre_forward_backward(RunContext& ctx, Module& m, const Placed& dx) override;
    void post_backward(RunContext& ctx, Module& m) override;
    std::optional<Placement> compute_out(const Module&) const override { return rule_.compute_out; }
    std::optional<Placement> compute_grad_in(const Module&) const override { return rule_.grad_in; }
    std::function<Tensor()> pack_saved(const Tensor& t) override;

protected:
    // After the output's redistribution (rowwise: the bias, added once).
    virtual Placed finish_forward(RunContext&, Module&, const Placed& y) { return y; }
    // The parameter gradients `sync` names, as this call's backward left them (a shard or a
    // partial sum), to be reduced to Replicate and added to the gradients.
    virtual void start_backward(RunContext&, Module&, const Placed& /*dy*/) {}
    virtual std::vector<Tensor> grad_pieces(RunContext&, Module&) { return {}; }
    Communicator& tp() { return tp_; }
    const StyleSpec& spec() const { return spec_; }

private:
    StyleSpec spec_;
    StyleRule rule_;
    Communicator& tp_;
    MicrobatchStack<Layout> outputs_;  // per call: the declared output layout (shared modules run twice)
    // save_input shard, during one forward: the input as it came and as it was gathered
    Placed shard_, gathered_;
};

}  // namespace ptool
