// Parameter-free elementwise modules (relu, gelu, silu, tanh, identity) and dropout.
#include "core/rng.h"
#include "core/tensor_ops.h"
#include "model/context_shard.h"
#include "model/layers.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// Elementwise and parameter-free: they keep the activation's layout in a tensor-parallel plan.
class ElementwiseType : public ModuleType {
public:
    using ModuleType::ModuleType;
    TpTemplate tp_template() const override { return {.rule = TpRule::elementwise}; }
};

// relu, silu, tanh: no keys.
class ActivationType final : public ElementwiseType {
public:
    ActivationType(std::string name, int listed, Activation act)
        : ElementwiseType(std::move(name), listed), act_(act) {}
    std::shared_ptr<Module> build(ModuleBuilder&, ModuleEntry& e) const override {
        return std::make_shared<ActivationModule>(*this, e.name, e.where, act_);
    }

private:
    Activation act_;
};

// gelu: approximate (none: the exact erf; tanh), as nn.GELU.
class GeluType final : public ElementwiseType {
public:
    GeluType() : ElementwiseType("gelu", 30) {}
    std::shared_ptr<Module> build(ModuleBuilder&, ModuleEntry& e) const override {
        const std::string approx = e.keys.string_or("approximate", "none");
        if (approx != "none" && approx != "tanh")
            e.keys.at("approximate")
                .fail(fmt::format("gelu approximate must be none or tanh, got '{}'", approx));
        return std::make_shared<ActivationModule>(
            *this, e.name, e.where, approx == "tanh" ? Activation::gelu_tanh : Activation::gelu);
    }
};

class IdentityType final : public ElementwiseType {
public:
    IdentityType() : ElementwiseType("identity", 60) {}
    std::shared_ptr<Module> build(ModuleBuilder&, ModuleEntry& e) const override {
        return std::make_shared<Identity>(e.name, e.where);
    }
};

// dropout: p (0.5), in [0, 1] as nn.Dropout's (p 1: every element dropped, the output input * 0).
class DropoutType final : public ElementwiseType {
public:
    DropoutType() : ElementwiseType("dropout", 120) {}
    std::shared_ptr<Module> build(ModuleBuilder&, ModuleEntry& e) const override {
        const double p = e.keys.double_or("p", 0.5);
        if (!(p >= 0.0 && p <= 1.0))
            e.keys.at("p").fail(fmt::format("dropout p must be in [0, 1], got {}", p));
        return std::make_shared<Dropout>(e.name, e.where, p);
    }
};

const ActivationType relu_type("relu", 20, Activation::relu), silu_type("silu", 40, Activation::silu),
    tanh_type("tanh", 50, Activation::tanh);
const GeluType gelu_type;
const IdentityType identity_type;
const DropoutType dropout_type;
PTOOL_REGISTER_MODULE_TYPE(relu_type);
PTOOL_REGISTER_MODULE_TYPE(gelu_type);
PTOOL_REGISTER_MODULE_TYPE(silu_type);
PTOOL_REGISTER_MODULE_TYPE(tanh_type);
PTOOL_REGISTER_MODULE_TYPE(identity_type);
PTOOL_REGISTER_MODULE_TYPE(dropout_type);

}  // namespace

Identity::Identity(std::string name, SourceLocation where)
    : Module(identity_type, std::move(name), std::move(where)) {}

Dropout::Dropout(std::string name, SourceLocation where, double p)
    : Module(dropout_type, std::move(name), std::move(where)), p_(p) {}

Placement ActivationModule::out_placement(const Layout& in) const {
    if (in.p.is_partial())
        conflict(fmt::format(
            "'{}' ({}) is not linear: applied to each rank's partial sum it does not give the activation "
            "of the sum (reduce it first)",
            fqn(), type()));
    return in.p;
}

Tensor ActivationModule::forward_impl(RunContext& ctx, const Tensor& x) {
    Tensor y = empty_like(x);
    ctx.backend->activation(act_, x, y);
    save({x});
    return y;
}

Tensor ActivationModule::backward_impl(RunContext& ctx, const Tensor& dy) {
    const Tensor x = restore()[0];
    Tensor dx = empty_like(dy);
    ctx.backend->activation_backward(act_, x, dy, dx);
    return dx;
}

Tensor Dropout::mask(const RunContext& ctx, const Placed& x) const {
    if (x.t.device() == Device::meta)
        return Tensor::empty(x.t.shape(), x.t.dtype(), Device::meta);  // a simulated step
    CounterRng rng(ctx.seed, stream_id("dropout", fqn(), static_cast<uint64_t>(ctx.step)));
    const Device device = ctx.backend ? ctx.backend->device() : Device::cpu;
    const Shape& local = x.t.shape();
    const int64_t nd = static_cast<int64_t>(local.size());
    // local multi-index -> the element's index in the whole tensor: a tp shard starts at its chunk's
    // offset along its dim, this dp rank's rows at row_offset, strides are the full tensor's
    std::vector<int64_t> offset(local.size(), 0), stride(local.size(), 1);
    if (x.p.is_shard() && nd > 0) {
        const int64_t d = x.p.normalized(nd).dim;
        offset[d] = chunk_of(x.global[d], ctx.tp_parts, ctx.tp_rank).offset;
    }
    if (nd > 0) offset[0] += ctx.row_offset;
    // under context parallelism dim 1 is this rank's positions of the sequence (model/context_shard.h)
    const std::vector<int64_t>* positions = ctx.context && nd > 1 ? &ctx.context->positions : nullptr;
    std::vector<int64_t> whole = x.global;
    if (positions) whole[1] = ctx.context->seq;
    for (int64_t d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * whole[d + 1];
    Tensor m(local, x.t.dtype());  // drawn on the host (the counter RNG is host code), then moved
    const double keep_scale =
        p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;  // (p 1 keeps nothing: every draw is below it)
    std::vector<int64_t> idx(local.size(), 0);
    for (int64_t i = 0, n = m.numel(); i < n; ++i) {
        int64_t global = 0;
        for (int64_t d = 0; d < nd; ++d)
            global += (d == 1 && positions ? (*positions)[static_cast<size_t>(idx[1] + offset[1])]
                                           : idx[d] + offset[d]) *
                      stride[d];
        m.set(i, rng.uniform(static_cast<uint64_t>(global)) < p_ ? 0.0 : keep_scale);
        for (int64_t d = nd - 1; d >= 0 && ++idx[d] == local[d]; --d) idx[d] = 0;  // the next local element
    }
    return device == Device::cpu ? m : m.to_device(device);
}

Placed Dropout::forward_placed(RunContext& ctx, const Placed& x) {
    if (!ctx.training || p_ == 0.0) {
        save({});
        return x;
    }
    Tensor m = mask(ctx, x);
    Tensor y = empty_like(x.t);
    ctx.backend->mul(x.t, m, y);
    save({m});
    return {y, x.p, x.global};
}

Tensor Dropout::backward_impl(RunContext& ctx, const Tensor& dy) {
    std::vector<Tensor> saved = restore();
    if (saved.empty()) return dy;
    Tensor dx = empty_like(dy);
    ctx.backend->mul(dy, saved[0], dx);
    return dx;
}

}  // namespace ptool
