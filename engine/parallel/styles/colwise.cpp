// colwise: PyTorch's ColwiseParallel, Megatron's ColumnParallelLinear.
//   linear     weight Shard(0), bias Shard(0); input input_layouts (Replicate) -> Replicate;
//              computes Shard(-1); output -> output_layouts (Shard(-1)). Backward: the input
//              gradient is Partial (dy_local @ W_local) -> all_reduce (Megatron's f), or
//              reduce_scatter when the input was Shard(d) (sequence parallel).
//   embedding  weight Shard(1) (the embedding dim); ids replicated; computes Shard(-1).
//   save_input (linear with input_layouts shard(d)): what the weight gradient reads in backward.
//              `gathered` (PyTorch's DTensor, the default) keeps the all-gathered input from the
//              forward; `shard` (Megatron's sequence parallelism, Korthikanti et al. 2022) keeps
//              this rank's shard and all-gathers it again in backward (StyleHooks::pack_saved).
#include "parallel/styles/sharding.h"

namespace ptool::styles {
namespace {

class Colwise final : public ShardingStyle {
public:
    std::string_view name() const override { return style_name::colwise; }

    void parse(YamlMap& m, const YamlNode& node, StyleSpec& s) const override {
        ShardingStyle::parse(m, node, s);
        auto v = m.get("save_input");
        if (!v) return;
        const std::string text = v->as_string("'save_input'");
        if (text != "gathered" && text != "shard")
            v->fail(
                fmt::format("'save_input: {}' is not one of gathered (PyTorch's DTensor, the default), "
                            "shard (Megatron's sequence parallelism)",
                            text));
        s.save_input_shard = text == "shard";
        if (s.save_input_shard && !(s.input_layouts && s.input_layouts->is_shard()))
            v->fail(
                "'save_input: shard' keeps the input's shard for backward: it needs an input that is "
                "gathered, input_layouts: shard(d) (sequence parallelism: shard(1))");
    }

    void check(const StyleCheck& c) const override {
        if (c.spec.save_input_shard && !as_linear(c.module))
            throw InputError(c.where, fmt::format("'{}' ({}): save_input: shard applies to linear modules, "
                                                  "not to {} ({})",
                                                  c.module.fqn(), name(), c.module.fqn(), c.module.type()));
        if (const Linear* lin = as_linear(c.module))
            check_sharded_weight(c, name(), lin->out_features(), "output features");
        else
            check_sharded_weight(c, name(), as_embedding(c.module)->dim(), "embedding dims");
    }

    std::vector<ParamPlacement> params(const Module& m) const override {
        if (as_embedding(m)) return {{"weight", Placement::shard(1)}};
        std::vector<ParamPlacement> out = {{"weight", Placement::shard(0)}};
        if (m.param("bias")) out.push_back({"bias", Placement::shard(0)});
        return out;
    }

    StyleRule rule(const Module& m, const StyleSpec& s) const override {
        StyleRule r;
        r.pre = Redistribution{s.input_layouts.value_or(Placement::replicate()), Placement::replicate()};
        r.compute_out = Placement::shard(-1);
        if (as_linear(m)) r.grad_in = Placement::partial();
        r.post = Redistribution{Placement::shard(-1), s.output_layouts.value_or(Placement::shard(-1))};
        return r;
    }
};

PTOOL_REGISTER_STYLE(Colwise);

}  // namespace
}  // namespace ptool::styles
