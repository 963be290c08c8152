// Parameter-free elementwise modules (relu, gelu, silu, tanh) and dropout.
#include "core/rng.h"
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

Tensor Dropout::mask(const RunContext& ctx, const Shape& shape, DType dtype, int64_t offset) const {
    CounterRng rng(ctx.seed, stream_id("dropout", fqn(), static_cast<uint64_t>(ctx.step)));
    const Device device = ctx.backend ? ctx.backend->device() : Device::cpu;
    Tensor m(shape, dtype);  // drawn on the host (the counter RNG is host code), then moved
    const double keep_scale = 1.0 / (1.0 - p_);
    for (int64_t i = 0; i < m.numel(); ++i) m.set(i, rng.uniform(offset + i) < p_ ? 0.0 : keep_scale);
    return device == Device::cpu ? m : m.to_device(device);
}

Tensor Dropout::forward_impl(RunContext& ctx, const Tensor& x) {
    if (!ctx.training || p_ == 0.0) {
        save({});
        return x;
    }
    const int64_t row = x.dim() > 0 && x.size(0) > 0 ? x.numel() / x.size(0) : 0;
    Tensor m = mask(ctx, x.shape(), x.dtype(), ctx.row_offset * row);  // the reference's mask for these rows
    Tensor y = empty_like(x);
    ctx.backend->mul(x, m, y);
    save({m});
    return y;
}

Tensor Dropout::backward_impl(RunContext& ctx, const Tensor& dy) {
    std::vector<Tensor> saved = restore();
    if (saved.empty()) return dy;
    Tensor dx = empty_like(dy);
    ctx.backend->mul(dy, saved[0], dx);
    return dx;
}

}  // namespace ptool
