// Parameter-free elementwise modules (relu, gelu, silu, tanh) and dropout.
#include "core/rng.h"
#include "core/tensor_ops.h"
#include "model/layers.h"

namespace ptool {

Placement ActivationModule::out_placement(const Layout& in) const {
    if (in.p.is_partial())
        conflict(fmt::format("'{}' ({}) is not linear: applied to each rank's partial sum it does not give the activation "
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
    if (x.t.device() == Device::meta) return Tensor::empty(x.t.shape(), x.t.dtype(), Device::meta);  // a simulated step
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
    for (int64_t d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * x.global[d + 1];
    Tensor m(local, x.t.dtype());  // drawn on the host (the counter RNG is host code), then moved
    const double keep_scale = 1.0 / (1.0 - p_);
    std::vector<int64_t> idx(local.size(), 0);
    for (int64_t i = 0, n = m.numel(); i < n; ++i) {
        int64_t global = 0;
        for (int64_t d = 0; d < nd; ++d) global += (idx[d] + offset[d]) * stride[d];
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
