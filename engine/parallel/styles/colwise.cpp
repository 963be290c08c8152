// colwise: PyTorch's ColwiseParallel, Megatron's ColumnParallelLinear.
//   linear     weight Shard(0), bias Shard(0); input input_layouts (Replicate) -> Replicate;
//              computes Shard(-1); output -> output_layouts (Shard(-1)). Backward: the input
//              gradient is Partial (dy_local @ W_local) -> all_reduce (Megatron's f), or
//              reduce_scatter when the input was Shard(d) (sequence parallel).
//   embedding  weight Shard(1) (the embedding dim); ids replicated; computes Shard(-1).
#include "parallel/styles/sharding.h"

namespace ptool::styles {
namespace {

class Colwise final : public ShardingStyle {
public:
    std::string_view name() const override { return style_name::colwise; }

    void check(const StyleCheck& c) const override {
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
