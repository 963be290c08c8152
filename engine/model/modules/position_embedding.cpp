// position_embedding: GPT-2's learned absolute positions (HF's `wpe`, an nn.Embedding over
// position ids 0..T-1 added to the token embeddings): y = x + weight[0:T].
#include "core/tensor_ops.h"
#include "model/context_shard.h"
#include "model/layers.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// position_embedding: positions, dim.
class PositionEmbeddingType final : public ModuleType {
public:
    PositionEmbeddingType() : ModuleType("position_embedding", 110) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        const int64_t positions = e.positive("positions"), dim = e.positive("dim");
        b.account(e.keys.at("dim"), size_mul(e.keys.at("dim"), positions, dim));
        return std::make_shared<PositionEmbedding>(e.name, e.where, positions, dim, b.dtype());
    }
    // Each row of its weight is a position: it needs whole sequences (and features).
    TpTemplate tp_template() const override { return {.rule = TpRule::whole}; }
    // The proxy's sequences are short (2 x tp): its positions stay.
    ShrinkKeys shrink_keys() const override { return {.sizes = {"dim"}}; }
};
const PositionEmbeddingType position_embedding_type;
PTOOL_REGISTER_MODULE_TYPE(position_embedding_type);

}  // namespace

PositionEmbedding::PositionEmbedding(std::string name, SourceLocation where, int64_t positions, int64_t dim,
                                     DType dtype)
    : Module(position_embedding_type, std::move(name), std::move(where)), positions_(positions), dim_(dim) {
    register_param("weight", make_param({positions, dim}, dtype));
}

Shape PositionEmbedding::output_shape(const Shape& in) const {
    if (in.size() != 3 || in[2] != dim_)
        fail(fmt::format("position_embedding '{}' needs [batch, sequence, {}], got {}", fqn(), dim_,
                         shape_str(in)));
    if (in[1] > positions_)
        fail(fmt::format("position_embedding '{}' has {} positions, the sequence is {} long", fqn(),
                         positions_, in[1]));
    return in;
}

Placement PositionEmbedding::out_placement(const Layout& in) const {
    const Placement p = in.p.normalized(static_cast<int64_t>(in.global.size()));
    if (p.is_partial())
        conflict(fmt::format("'{}' (position_embedding) adds its weight to partial sums: reduce them first",
                             fqn()));
    if (p.is_shard() && p.dim != 0)
        conflict(fmt::format(
            "'{}' (position_embedding) needs whole sequences and features (its rows are positions), got {}: "
            "shard the sequence after it",
            fqn(), p.str()));
    return in.p;
}

void PositionEmbedding::init_params(uint64_t seed) {
    init_normal(param("weight")->value, seed, join_name(fqn(), "weight"), std_);
}

// The position id of every (row, t) of x: t, or under context parallelism t's global position.
Tensor PositionEmbedding::position_ids(const RunContext& ctx, const Tensor& x) const {
    const Shape ids_shape{x.size(0), x.size(1)};
    if (x.device() == Device::meta) return Tensor::empty(ids_shape, DType::int64, Device::meta);
    Tensor ids(ids_shape, DType::int64);
    for (int64_t i = 0; i < ids.numel(); ++i) {
        const int64_t t = i % x.size(1);
        ids.data<int64_t>()[i] = ctx.context ? ctx.context->positions[static_cast<size_t>(t)] : t;
    }
    return x.device() == Device::cpu ? ids : ids.to_device(x.device());
}

Tensor PositionEmbedding::forward_impl(RunContext& ctx, const Tensor& x) {
    const Tensor ids = position_ids(ctx, x);
    Tensor e = empty_like(x), y = empty_like(x);
    ctx.backend->embedding(ids, param("weight")->value, e);
    ctx.backend->add(x, e, y);
    save({ids});
    return y;
}

Tensor PositionEmbedding::backward_impl(RunContext& ctx, const Tensor& dy) {
    const Tensor ids = restore()[0];
    defer_weights(ctx, [ids, dy, w = param("weight")](RunContext& c) {
        c.backend->embedding_backward(ids, dy, w->grad);
    });
    return dy;
}

}  // namespace ptool
