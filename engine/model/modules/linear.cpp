// nn.Linear with explicit backward:
//   forward   y = x @ W^T + b        x: [rows, in], W: [out, in], y: [rows, out]
//   backward  dW += dy^T @ x          dW: [out, in]
//             db += sum_rows(dy)      db: [out]
//             dx  = dy @ W            dx: [rows, in]
#include <cmath>

#include "model/layers.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// linear: in, out, bias (true), tie (an earlier module whose weight [out, in] this one uses).
class LinearType final : public ModuleType {
public:
    LinearType() : ModuleType("linear", 10) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        YamlMap& m = e.keys;
        const int64_t in = e.positive("in"), out = e.positive("out");
        const bool bias = m.bool_or("bias", true);
        const int64_t weight =
            m.has("tie") ? 0 : size_mul(m.at("out"), in, out);  // a tied weight is the other module's
        b.account(m.at("out"), size_add(m.node(), weight, bias ? out : 0));
        ParamPtr tied;
        if (auto t = m.get("tie")) {
            auto target = b.lookup(*t, t->as_string("'tie'"), "tie");
            tied = target->param("weight");
            if (!tied) t->fail(fmt::format("'tie: {}' names a module with no weight", target->fqn()));
            if (tied->value.shape() != Shape{out, in})
                t->fail(fmt::format("'tie: {}' weight is {}, but this linear needs [{}, {}] ([out, in])",
                                    target->fqn(), shape_str(tied->value.shape()), out, in));
        }
        return std::make_shared<Linear>(e.name, e.where, in, out, bias, b.dtype(), tied);
    }
    TpTemplate tp_template() const override { return {.rule = TpRule::linear}; }
    ShrinkKeys shrink_keys() const override { return {.sizes = {"in", "out"}}; }
};
const LinearType linear_type;
PTOOL_REGISTER_MODULE_TYPE(linear_type);

}  // namespace

Linear::Linear(std::string name, SourceLocation where, int64_t in, int64_t out, bool bias, DType dtype,
               ParamPtr tied_weight)
    : Module(linear_type, std::move(name), std::move(where)),
      in_(in),
      out_(out),
      tied_(tied_weight != nullptr) {
    register_param("weight", tied_weight ? tied_weight : make_param({out, in}, dtype));
    if (bias) register_param("bias", make_param({out}, dtype));
}

Shape Linear::output_shape(const Shape& in) const {
    if (in.empty() || in.back() != in_)
        fail(fmt::format("linear '{}' expects inputs [..., {}], got {}", fqn(), in_, shape_str(in)));
    Shape out = in;
    out.back() = out_;
    return out;
}

Placement Linear::out_placement(const Layout& in) const {
    const Placement p = in.p.normalized(static_cast<int64_t>(in.global.size()));
    if (p.is_shard() && p.dim == static_cast<int64_t>(in.global.size()) - 1)
        conflict(fmt::format("'{}' (linear) needs whole rows", fqn()));
    if (p.is_partial()) conflict(fmt::format("'{}' (linear) needs a reduced input, not partial sums", fqn()));
    return p;
}

// kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(in) for the weight; the bias uses the same bound.
// Under set_normal_init (transformers' _init_weights) the weight ~ N(0, std) and the bias is 0.
void Linear::init_params(uint64_t seed) {
    if (normal_std_) {
        if (!tied_) init_normal(param("weight")->value, seed, join_name(fqn(), "weight"), *normal_std_);
        if (auto b = param("bias")) fill_value(b->value, 0.0);
        return;
    }
    const double bound = in_ > 0 ? 1.0 / std::sqrt(static_cast<double>(in_)) : 0.0;
    if (!tied_) init_uniform(param("weight")->value, seed, join_name(fqn(), "weight"), bound);
    if (auto b = param("bias")) init_uniform(b->value, seed, join_name(fqn(), "bias"), bound);
}

void Linear::init_shard(uint64_t seed, const std::string& name, Tensor& local, int64_t dim,
                        int64_t offset) const {
    const Shape full = name == "weight" ? Shape{out_, in_} : Shape{out_};
    if (normal_std_) {
        if (name != "weight") return fill_value(local, 0.0);
        if (dim < 0) return init_normal(local, seed, join_name(fqn(), name), *normal_std_);
        return init_normal_shard(local, seed, join_name(fqn(), name), *normal_std_, full, dim, offset);
    }
    const double bound = in_ > 0 ? 1.0 / std::sqrt(static_cast<double>(in_)) : 0.0;
    if (dim < 0)
        init_uniform(local, seed, join_name(fqn(), name), bound);
    else
        init_uniform_shard(local, seed, join_name(fqn(), name), bound, full, dim, offset);
}

Tensor Linear::forward_impl(RunContext& ctx, const Tensor& x) {
    const int64_t in = x.size(-1);  // in_, or in_/tp under rowwise parallelism
    if (in != param("weight")->value.size(1))
        fail(fmt::format(
            "linear '{}' got an input of {} features but its weight takes {}: under tensor parallelism "
            "the activation reaching it is sharded; give '{}' a style, or make its producer output replicate",
            fqn(), in, param("weight")->value.size(1), fqn()));
    const Tensor x2 = x.reshape({leading_numel(x.shape()), in});  // in may be 0: an empty rowwise shard
    // aten.mm, or aten.addmm with the bias here: the op-level selective policy keeps every other mm
    const bool addmm = param("bias") && !defer_bias_;
    const KeptOutput kept = kept_output(ctx, addmm ? SelectiveOp::addmm : SelectiveOp::mm);
    if (kept == KeptOutput::take) {  // the recompute: the forward's output, this input saved for backward
        save({x2});
        return kept_.take(ctx);
    }
    const int64_t out = param("weight")->value.size(0);  // out_, or its shard under colwise
    Shape out_shape = x.shape();
    out_shape.back() = out;
    Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
    Tensor y2 = y.reshape({x2.size(0), out});
    if (float8_)  // rows of sequences: where cp cuts them, verify's reference scales each rank's apart
        float8_forward(ctx, *float8_, x2, *param("weight"), y2, x.dim() == 3 ? x.size(1) : 1);
    else
        ctx.backend->gemm(x2, false, param("weight")->value, true, y2);
    if (addmm) ctx.backend->add_bias(y2, param("bias")->value);
    save({x2});
    if (kept == KeptOutput::keep) kept_.keep(ctx, y);
    return y;
}

Tensor Linear::backward_impl(RunContext& ctx, const Tensor& dy) {
    const Tensor x2 = restore()[0];
    const Tensor dy2 = dy.reshape({x2.size(0), dy.size(-1)});
    ParamPtr w = param("weight");
    // float8: the scales once, for both GEMMs (a split backward's W keeps them)
    std::optional<Float8BackwardAmax> amax;
    if (float8_) amax = float8_backward_amax(ctx, *float8_, dy2, x2, *w, dy.dim() == 3 ? dy.size(1) : 1);
    defer_weights(ctx,
                  [this, x2, dy2, w, amax](RunContext& c) {
                      if (amax)
                          float8_weight_grad(c, *float8_, *amax, dy2, x2, w->grad);
                      else
                          c.backend->gemm(dy2, true, x2, false, w->grad, 1.0, 1.0);
                      if (auto b = param("bias"); b && !defer_bias_) c.backend->sum_rows(dy2, b->grad, true);
                  },
                  {x2});
    Shape in_shape = dy.shape();
    in_shape.back() = x2.size(1);
    Tensor dx = Tensor::empty(in_shape, dy.dtype(), dy.device());
    Tensor dx2 = dx.reshape({x2.size(0), x2.size(1)});
    if (amax)
        float8_input_grad(ctx, *float8_, *amax, dy2, *w, dx2);
    else
        ctx.backend->gemm(dy2, false, w->value, false, dx2);
    return dx;
}

}  // namespace ptool
