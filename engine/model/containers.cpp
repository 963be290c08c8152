// gated_mlp, sequential / repeat, residual.
#include "model/blocks.h"

namespace ptool {

GatedMlp::GatedMlp(std::string name, SourceLocation where, int64_t dim, int64_t hidden, Activation act, bool bias,
                   DType dtype)
    : Module("gated_mlp", std::move(name), std::move(where)), act_(act) {
    add_child("gate_proj", std::make_shared<Linear>("gate_proj", this->where(), dim, hidden, bias, dtype));
    add_child("up_proj", std::make_shared<Linear>("up_proj", this->where(), dim, hidden, bias, dtype));
    add_child("down_proj", std::make_shared<Linear>("down_proj", this->where(), hidden, dim, bias, dtype));
}

Shape GatedMlp::output_shape(const Shape& in) const {
    return child(2).output_shape(child(0).output_shape(in));
}

Tensor GatedMlp::forward_impl(RunContext& ctx, const Tensor& x) {
    Backend& be = *ctx.backend;
    Tensor g = child(0).forward(ctx, x);  // [.., hidden]
    Tensor u = child(1).forward(ctx, x);
    Tensor a = empty_like(g), h = empty_like(g);
    be.activation(act_, g, a);
    be.mul(a, u, h);
    save({g, a, u});
    return child(2).forward(ctx, h);
}

Tensor GatedMlp::backward_impl(RunContext& ctx, const Tensor& dy) {
    Backend& be = *ctx.backend;
    std::vector<Tensor> s = restore();
    const Tensor &g = s[0], &a = s[1], &u = s[2];
    Tensor dh = child(2).backward(ctx, dy);
    Tensor du = empty_like(dh), da = empty_like(dh), dg = empty_like(dh);
    be.mul(dh, a, du);
    be.mul(dh, u, da);
    be.activation_backward(act_, g, da, dg);
    Tensor dx_up = child(1).backward(ctx, du);
    Tensor dx_gate = child(0).backward(ctx, dg);
    Tensor dx = empty_like(dx_up);
    be.add(dx_up, dx_gate, dx);
    return dx;
}

Shape Sequential::output_shape(const Shape& in) const {
    Shape s = in;
    for (const auto& [name, child] : children()) s = child->output_shape(s);
    return s;
}

bool Sequential::takes_ids() const { return !children().empty() && children()[0].second->takes_ids(); }

Tensor Sequential::forward_impl(RunContext& ctx, const Tensor& x) {
    Tensor h = x;
    for (const auto& [name, child] : children()) h = child->forward(ctx, h);
    return h;
}

Tensor Sequential::backward_impl(RunContext& ctx, const Tensor& dy) {
    Tensor d = dy;
    for (auto it = children().rbegin(); it != children().rend(); ++it) d = it->second->backward(ctx, d);
    return d;
}

Shape Residual::output_shape(const Shape& in) const {
    Shape out = Sequential::output_shape(in);
    if (out != in)
        fail(fmt::format("residual '{}' body maps {} to {}: y = x + body(x) needs the same shape", fqn(),
                         shape_str(in), shape_str(out)));
    return out;
}

Tensor Residual::forward_impl(RunContext& ctx, const Tensor& x) {
    Tensor body = Sequential::forward_impl(ctx, x);
    Tensor y = empty_like(x);
    ctx.backend->add(x, body, y);
    return y;
}

Tensor Residual::backward_impl(RunContext& ctx, const Tensor& dy) {
    Tensor dbody = Sequential::backward_impl(ctx, dy);
    Tensor dx = empty_like(dy);
    ctx.backend->add(dy, dbody, dx);
    return dx;
}

}  // namespace ptool
