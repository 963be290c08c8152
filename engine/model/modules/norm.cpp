// layer_norm, rms_norm (over the last dim) and batch_norm (per channel of [N, C]).
#include <cmath>
#include <optional>

#include "backend/meta/meta_backend.h"
#include "core/framework_memory.h"
#include "model/layers.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// layer_norm: dim, eps (1e-5), elementwise_affine (true), bias (true), as nn.LayerNorm;
// rms_norm: dim, eps (torch.finfo(dtype).eps, as nn.RMSNorm(eps=None)), elementwise_affine (true),
// implementation (fused: nn.RMSNorm's kernel; eager: transformers' LlamaRMSNorm, docs/model_format.md).
class NormType final : public ModuleType {
public:
    NormType(std::string name, int listed, bool rms) : ModuleType(std::move(name), listed), rms_(rms) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        YamlMap& m = e.keys;
        const int64_t dim = e.positive("dim");
        const bool affine = m.bool_or("elementwise_affine", true);
        const bool bias = !rms_ && m.bool_or("bias", true);
        b.account(m.node(), affine ? size_mul(m.node(), bias ? 2 : 1, dim) : 0);
        const double eps = m.double_or("eps", rms_ ? dtype_eps(b.dtype()) : 1e-5);
        bool eager = false;
        if (rms_ && m.has("implementation")) {
            YamlNode impl = m.at("implementation");
            const std::string v = impl.as_string("'implementation'");
            if (v != "fused" && v != "eager")
                impl.fail(
                    fmt::format("implementation '{}': valid: fused (nn.RMSNorm), eager (transformers' "
                                "LlamaRMSNorm)",
                                v));
            eager = v == "eager";
        }
        return std::make_shared<Norm>(*this, e.name, e.where, dim, eps, affine, bias, rms_, b.dtype(), eager);
    }
    TpTemplate tp_template() const override { return {.rule = TpRule::norm}; }
    ShrinkKeys shrink_keys() const override { return {.sizes = {"dim"}}; }

private:
    bool rms_;
};

// batch_norm: features, eps (1e-5), momentum (0.1), as nn.BatchNorm1d.
class BatchNormType final : public ModuleType {
public:
    BatchNormType() : ModuleType("batch_norm", 90) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        YamlMap& m = e.keys;
        const int64_t features = e.positive("features");
        b.account(m.node(), size_mul(m.node(), 4, features));  // weight, bias, running_mean, running_var
        b.account(m.node(), 1, DType::int64);                  // num_batches_tracked
        return std::make_shared<BatchNorm>(e.name, e.where, features, m.double_or("eps", 1e-5),
                                           m.double_or("momentum", 0.1), b.dtype());
    }
    // Statistics over the whole batch: no tensor-parallel rule (the writer plans none for the model).
    TpTemplate tp_template() const override { return {.rule = TpRule::none}; }
    ShrinkKeys shrink_keys() const override { return {.sizes = {"features"}}; }
};

const NormType layer_norm_type("layer_norm", 70, false), rms_norm_type("rms_norm", 80, true);
const BatchNormType batch_norm_type;
PTOOL_REGISTER_MODULE_TYPE(layer_norm_type);
PTOOL_REGISTER_MODULE_TYPE(rms_norm_type);
PTOOL_REGISTER_MODULE_TYPE(batch_norm_type);

// BatchNorm's per-channel bookkeeping (sync, running statistics) is small host arithmetic: it
// works on host views of the tensors (the tensors themselves on the CPU) and writes them back.
// (a meta tensor stands in for its host copy: a simulated step allocates what a CPU run does)
Tensor on_host(const Tensor& t) {
    return t.device() != Device::cuda ? t : t.to_device(Device::cpu);
}
Tensor on_device(const Tensor& host, Device d) {
    return d != Device::cuda ? host : host.to_device(d);
}
void write_back(Tensor& dst, const Tensor& host) {
    if (dst.raw() != host.raw()) copy_bytes(dst.raw(), dst.device(), host.raw(), Device::cpu, dst.nbytes());
}
}  // namespace

Norm::Norm(const ModuleType& type, std::string name, SourceLocation where, int64_t dim, double eps,
           bool affine, bool bias, bool rms, DType dtype, bool eager)
    : Module(type, std::move(name), std::move(where)), dim_(dim), eps_(eps), rms_(rms), eager_(eager) {
    if (affine) register_param("weight", make_param({dim}, dtype));
    if (affine && bias) register_param("bias", make_param({dim}, dtype));
}

Shape Norm::output_shape(const Shape& in) const {
    if (in.empty() || in.back() != dim_)
        fail(fmt::format("{} '{}' normalises a last dim of {}, got input {}", type(), fqn(), dim_,
                         shape_str(in)));
    return in;
}

Placement Norm::out_placement(const Layout& in) const {
    const Placement p = in.p.normalized(static_cast<int64_t>(in.global.size()));
    if (p.is_shard() && p.dim == static_cast<int64_t>(in.global.size()) - 1)
        conflict(fmt::format("'{}' ({}) needs whole rows", fqn(), type()));
    if (p.is_partial())
        conflict(fmt::format("'{}' ({}) needs a reduced input, not partial sums", fqn(), type()));
    return p;
}

void Norm::init_params(uint64_t) {
    if (auto w = param("weight")) fill_value(w->value, 1.0);
    if (auto b = param("bias")) fill_value(b->value, 0.0);
}

Tensor Norm::forward_impl(RunContext& ctx, const Tensor& x) {
    if (x.size(-1) != dim_)
        fail(fmt::format(
            "{} '{}' got a last dim of {} but normalises {}: under tensor parallelism the activation "
            "reaching it is sharded",
            type(), fqn(), x.size(-1), dim_));
    const int64_t rows = x.numel() / dim_;
    Tensor y = empty_like(x), mean({rows}, acc_dtype(x.dtype()), x.device()),
           rstd({rows}, acc_dtype(x.dtype()), x.device());
    ParamPtr w = param("weight"), b = param("bias");
    if (!eager_) {
        ctx.backend->layer_norm(x, w ? w->value : Tensor(), b ? b->value : Tensor(), eps_, rms(), y, mean,
                                rstd);
        save({x, mean, rstd});
        return y;
    }
    // LlamaRMSNorm keeps x.to(float32) for pow's and the product's backward, rsqrt's result, and
    // h = (x * rstd).to(dtype) for the weight's: ptool keeps the upcast (its backward casts it back
    // to x, exactly), rstd, and h as a tensor of the framework's tally alone (its values are not
    // needed: ptool's backward recomputes them from x)
    MetaKernelScope kernels({.on_chip = true});  // counted as the framework's op sequence
    const Tensor x32 = to_dtype(*ctx.backend, x, DType::float32);
    ctx.backend->layer_norm(x, w ? w->value : Tensor(), Tensor(), eps_, true, y, mean, rstd);
    const Tensor h = w ? torch_only(x.shape(), x.dtype(), MemoryUse::activations) : Tensor();
    save({x32, mean, rstd, h});
    meta_count_op(OpClass::rms_norm_eager_fwd, x.dtype(), static_cast<double>(x.numel()),
                  framework_kernels(OpClass::rms_norm_eager_fwd, x.dtype()));
    return y;
}

Tensor Norm::backward_impl(RunContext& ctx, const Tensor& dy) {
    std::vector<Tensor> s = restore();
    std::optional<MetaKernelScope> kernels;
    if (eager_) {  // x back from its upcast (exact); the framework's backward sequence is what is counted
        kernels.emplace(MetaKernelMode{.on_chip = true});
        TorchAllocScope own(TorchAlloc::ptool_only);  // ptool's stand-in: PyTorch computes from the upcast
        s[0] = to_dtype(*ctx.backend, s[0], dy.dtype());
        meta_count_op(OpClass::rms_norm_eager_bwd, dy.dtype(), static_cast<double>(dy.numel()),
                      framework_kernels(OpClass::rms_norm_eager_bwd, dy.dtype()));
    }
    Tensor dx = empty_like(dy);
    ParamPtr w = param("weight"), b = param("bias");
    if (!ctx.weight_work || !w) {  // one backward: dx, dw and db in the one kernel
        ctx.backend->layer_norm_backward(s[0], w ? w->value : Tensor(), s[1], s[2], dy, rms(), dx,
                                         w ? &w->grad : nullptr, b ? &b->grad : nullptr);
        return dx;
    }
    // split: dx now; dw and db later by the same kernel (its dx then discarded), so each is what
    // the one backward computes, bit for bit
    ctx.backend->layer_norm_backward(s[0], w->value, s[1], s[2], dy, rms(), dx, nullptr, nullptr);
    // the weight as the I saw it (autograd's saved tensor): fully_shard may have resharded it since
    defer_weights(ctx,
                  [s, dy, w, b, weight = w->value, rms = rms()](RunContext& c) {
                      Tensor discarded = empty_like(dy);
                      c.backend->layer_norm_backward(s[0], weight, s[1], s[2], dy, rms, discarded, &w->grad,
                                                     b ? &b->grad : nullptr);
                  },
                  {s[0], s[1], s[2]});
    return dx;
}

BatchNorm::BatchNorm(std::string name, SourceLocation where, int64_t features, double eps, double momentum,
                     DType dtype)
    : Module(batch_norm_type, std::move(name), std::move(where)),
      features_(features),
      eps_(eps),
      momentum_(momentum) {
    register_param("weight", make_param({features}, dtype));
    register_param("bias", make_param({features}, dtype));
    register_buffer("running_mean", make_buffer({features}, dtype));
    register_buffer("running_var", make_buffer({features}, dtype));
    register_buffer("num_batches_tracked", make_buffer({}, DType::int64));
}

Shape BatchNorm::output_shape(const Shape& in) const {
    if (in.size() != 2 || in[1] != features_)
        fail(fmt::format("batch_norm '{}' expects [N, {}], got {}", fqn(), features_, shape_str(in)));
    if (in[0] < 2)
        fail(fmt::format("batch_norm '{}' needs more than 1 value per channel in training", fqn()));
    return in;
}

Placement BatchNorm::out_placement(const Layout& in) const {
    if (!in.p.is_replicate())
        conflict(fmt::format(
            "'{}' (batch_norm) normalises each channel over the whole batch and needs it replicated "
            "on the tensor-parallel dim",
            fqn()));
    return in.p;
}

void BatchNorm::init_params(uint64_t) {
    fill_value(param("weight")->value, 1.0);
    fill_value(param("bias")->value, 0.0);
    fill_value(buffers()[0].param->value, 0.0);
    fill_value(buffers()[1].param->value, 1.0);
    buffers()[2].param->value.set(0, 0);
}

Tensor BatchNorm::forward_impl(RunContext& ctx, const Tensor& x) {
    const DType sd = acc_dtype(x.dtype());
    Tensor mean_d({features_}, sd, x.device()), var_d({features_}, sd, x.device()), rstd({features_}, sd);
    ctx.backend->channel_moments(x, mean_d, var_d);
    Tensor mean = on_host(mean_d), var = on_host(var_d);
    double n = static_cast<double>(x.size(0));
    if (sync_ && sync_->size() > 1) {
        // every rank's [mean, var] (equal batch sizes: data parallel splits evenly), combined in
        // rank order in double: mean = avg(mean_r), var = avg(var_r + (mean_r - mean)^2)
        const int world = sync_->size();
        Tensor local({1, 2 * features_}, sd), all({world, 2 * features_}, sd);
        for (int64_t c = 0; c < features_; ++c)
            local.set(c, mean.item(c)), local.set(features_ + c, var.item(c));
        sync_->all_gather(local, all);
        for (int64_t c = 0; c < features_; ++c) {
            double m = 0, v = 0;
            for (int r = 0; r < world; ++r) m += all.item(r * 2 * features_ + c);
            m /= world;
            for (int r = 0; r < world; ++r) {
                const double d = all.item(r * 2 * features_ + c) - m;
                v += all.item(r * 2 * features_ + features_ + c) + d * d;
            }
            mean.set(c, m);
            var.set(c, v / world);
        }
        n *= world;
    }
    for (int64_t c = 0; c < features_; ++c) rstd.set(c, 1.0 / std::sqrt(var.item(c) + eps_));
    if (!ctx.recomputing) {  // a checkpoint's recompute updates nothing twice
        Tensor running_mean = on_host(buffers()[0].param->value);
        Tensor running_var = on_host(buffers()[1].param->value);
        for (int64_t c = 0; c < features_; ++c) {
            // running stats: momentum update, unbiased variance (torch.nn.BatchNorm1d)
            running_mean.set(c, (1 - momentum_) * running_mean.item(c) + momentum_ * mean.item(c));
            running_var.set(c, (1 - momentum_) * running_var.item(c) + momentum_ * var.item(c) * n / (n - 1));
        }
        write_back(buffers()[0].param->value, running_mean);
        write_back(buffers()[1].param->value, running_var);
        Tensor& tracked = buffers()[2].param->value;
        tracked.set(0, tracked.item(0) + 1);
    }
    mean = on_device(mean, x.device());
    rstd = on_device(rstd, x.device());
    Tensor y = empty_like(x);
    ctx.backend->batch_norm_apply(x, mean, rstd, param("weight")->value, param("bias")->value, y);
    save({x, mean, rstd});
    return y;
}

Tensor BatchNorm::backward_impl(RunContext& ctx, const Tensor& dy) {
    std::vector<Tensor> s = restore();
    const DType sd = acc_dtype(dy.dtype());
    Tensor sum_dy_d({features_}, sd, dy.device()), sum_dy_xhat_d({features_}, sd, dy.device());
    ctx.backend->batch_norm_grad_sums(s[0], s[1], s[2], dy, sum_dy_d, sum_dy_xhat_d);
    Tensor sum_dy = on_host(sum_dy_d), sum_dy_xhat = on_host(sum_dy_xhat_d);
    ParamPtr w = param("weight"), b = param("bias");
    defer_weights(ctx, [this, sum_dy, sum_dy_xhat, w, b](RunContext&) {
        Tensor wg = on_host(w->grad), bg = on_host(b->grad);
        for (int64_t c = 0; c < features_; ++c) {
            wg.set(c, wg.item(c) + sum_dy_xhat.item(c));
            bg.set(c, bg.item(c) + sum_dy.item(c));
        }
        write_back(w->grad, wg);
        write_back(b->grad, bg);
    });
    double count = static_cast<double>(dy.size(0));
    if (sync_ && sync_->size() > 1) {  // the input gradient needs the sums over the global batch
        Tensor sums({2 * features_}, sd);
        for (int64_t c = 0; c < features_; ++c)
            sums.set(c, sum_dy.item(c)), sums.set(features_ + c, sum_dy_xhat.item(c));
        sync_->all_reduce(sums, ReduceOp::sum);
        sum_dy = sums.narrow(0, 0, features_).clone();
        sum_dy_xhat = sums.narrow(0, features_, features_).clone();
        count *= sync_->size();
    }
    Tensor dx = empty_like(dy);
    ctx.backend->batch_norm_backward_input(s[0], s[1], s[2], w->value, dy, on_device(sum_dy, dy.device()),
                                           on_device(sum_dy_xhat, dy.device()), count, dx);
    return dx;
}

}  // namespace ptool
