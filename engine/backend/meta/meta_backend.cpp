#include "backend/meta/meta_backend.h"

#include <cmath>

namespace ptool {
namespace {

thread_local MetaWork t_work;

// The linear's (m, n, k) of a GEMM c = op(a) op(b) reducing over `k` (GemmOp has the layouts).
GemmKey gemm_key(DType dtype, bool trans_a, bool trans_b, const Tensor& c, int64_t reduce) {
    const int64_t rows = c.dim() >= 2 ? c.size(-2) : 1, cols = c.dim() >= 1 ? c.size(-1) : 1;
    const int64_t batch = rows * cols > 0 ? c.numel() / (rows * cols) : 1;
    if (trans_a) return {GemmOp::wgrad, dtype, batch * reduce, rows, cols};  // dY^T [n, m] @ X [m, k]
    if (trans_b) return {GemmOp::fwd, dtype, batch * rows, cols, reduce};    // X [m, k] @ W^T
    return {GemmOp::dgrad, dtype, batch * rows, reduce, cols};               // dY [m, n] @ W [n, k]
}

template <class Map>
void add_counts(Map& into, const Map& from, double k) {
    for (const auto& [key, v] : from) into[key] += v * k;
}

double bytes_of(std::initializer_list<const Tensor*> ts) {
    double b = 0;
    for (const Tensor* t : ts)
        if (t && t->defined()) b += static_cast<double>(t->nbytes());
    return b;
}

class MetaBackend final : public Backend {
public:
    Device device() const override { return Device::meta; }
    std::string name() const override { return "meta (no kernels)"; }

    void gemm(const Tensor& a, bool trans_a, const Tensor&, bool trans_b, Tensor& c, double,
              double beta) override {
        if (t_work.mode.gemm_as_elementwise) return touch({&a, &c, beta != 0 ? &c : nullptr});
        const int64_t k = trans_a ? a.size(-2) : a.size(-1);
        const double flops =
            2.0 * static_cast<double>(c.numel()) * static_cast<double>(k) * t_work.mode.gemm_share;
        t_work.gemm_flops += flops;
        if (t_work.recomputing) t_work.recompute_flops += flops;
        if (t_work.mode.attention) {
            t_work.attention[t_work.mode.attention_key] += flops;
            return;
        }
        GemmKey key = gemm_key(t_work.mode.gemm_dtype.value_or(a.dtype()), trans_a, trans_b, c, k);
        key.float8 = t_work.mode.gemm_float8;
        t_work.gemms[key] += 1;
    }
    void activation(Activation, const Tensor& x, Tensor& y) override { touch({&x, &y}); }
    void activation_backward(Activation, const Tensor& x, const Tensor& dy, Tensor& dx) override {
        touch({&x, &dy, &dx});
    }
    void add(const Tensor& a, const Tensor& b, Tensor& out) override { touch({&a, &b, &out}); }
    void mul(const Tensor& a, const Tensor& b, Tensor& out) override { touch({&a, &b, &out}); }
    void axpy(double, const Tensor& x, Tensor& y) override { touch({&x, &y, &y}); }
    void scale(const Tensor& x, double, Tensor& out) override { touch({&x, &out}); }
    void fill(Tensor& t, double) override { touch({&t}); }
    // counted as the activation and mul they fuse (the time model's kernels and bytes unchanged:
    // an upper bound on the fused kernel's)
    void gated_activation(Activation, const Tensor& g, const Tensor& u, Tensor& a, Tensor& h) override {
        touch({&g, &a}), touch({&a, &u, &h});
    }
    void gated_activation_backward(Activation, const Tensor& g, const Tensor& a, const Tensor& u,
                                   const Tensor& dh, Tensor& du, Tensor& dg) override {
        touch({&dh, &a, &du}), touch({&dh, &u, &dg}), touch({&g, &dg, &dg});
    }
    void copy(const Tensor& src, Tensor& dst) override { touch({&src, &dst}); }
    void add_bias(Tensor& y, const Tensor& bias) override { touch({&y, &y, &bias}); }
    void sum_rows(const Tensor& dy, Tensor& db, bool) override { touch({&dy, &db}); }
    double sum_all(const Tensor& x) override {
        touch({&x});
        return 0;
    }
    void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double, bool, Tensor& y, Tensor& mean,
                    Tensor& rstd) override {
        touch({&x, &w, &b, &y, &mean, &rstd});
    }
    void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, bool, Tensor& dx, Tensor* dw, Tensor* db) override {
        touch({&x, &w, &mean, &rstd, &dy, &dx, dw, db});
    }
    void channel_moments(const Tensor& x, Tensor& mean, Tensor& var) override { touch({&x, &mean, &var}); }
    void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                          const Tensor& b, Tensor& y) override {
        touch({&x, &mean, &rstd, &w, &b, &y});
    }
    void batch_norm_grad_sums(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                              Tensor& sum_dy, Tensor& sum_dy_xhat) override {
        touch({&x, &mean, &rstd, &dy, &sum_dy, &sum_dy_xhat});
    }
    void batch_norm_backward_input(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                   const Tensor& dy, const Tensor& sum_dy, const Tensor& sum_dy_xhat, double,
                                   Tensor& dx) override {
        touch({&x, &mean, &rstd, &w, &dy, &sum_dy, &sum_dy_xhat, &dx});
    }
    void embedding(const Tensor& ids, const Tensor&, Tensor& y) override { touch({&ids, &y, &y}); }
    void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dw) override {
        touch({&ids, &dy, &dy}), (void)dw;
    }
    void transpose12(const Tensor& x, Tensor& y) override { touch({&x, &y}); }
    void softmax(const Tensor& x, bool, Tensor& y) override { touch({&x, &y}); }
    void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override { touch({&y, &dy, &dx}); }
    void softmax_stats(const Tensor& x, Tensor& y, Tensor& m, Tensor& l) override { touch({&x, &y, &m, &l}); }
    void softmax_merge(Tensor& o, Tensor& m, Tensor& l, const Tensor& o_b, const Tensor& m_b,
                       const Tensor& l_b) override {
        touch({&o, &m, &l, &o_b, &m_b, &l_b});
    }
    void softmax_from_stats(const Tensor& x, const Tensor& m, const Tensor& l, Tensor& y) override {
        touch({&x, &m, &l, &y});
    }
    void softmax_backward_rows(const Tensor& y, const Tensor& dy, const Tensor& o, const Tensor& d_o,
                               Tensor& dx) override {
        touch({&y, &dy, &o, &d_o, &dx});
    }
    void draw_init(Tensor&, const InitDraw&) override {}  // meta keeps no values (runs on meta draw none)
    double cross_entropy(const Tensor& logits, const Tensor& target, int64_t, double,
                         Tensor& dlogits) override {
        touch({&logits, &target, &dlogits});
        return 0;
    }
    double mse(const Tensor& out, const Tensor& target, double, Tensor& dout) override {
        touch({&out, &target, &dout});
        return 0;
    }
    void sgd_step(Tensor& p, const Tensor& g, Tensor& buf, double, double, double, bool) override {
        touch({&p, &g, &buf, &p, &buf});
    }
    void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, int64_t, double, double, double, double,
                    double) override {
        touch({&p, &g, &m, &v, &p, &m, &v});
    }

private:
    static void touch(std::initializer_list<const Tensor*> ts) {
        if (t_work.mode.on_chip) return;  // inside a fused kernel: no traffic, no launch of its own
        t_work.memory_bytes += bytes_of(ts);
        ++t_work.kernels;
    }
};

}  // namespace

MetaWork& meta_work() {
    return t_work;
}

const char* gemm_op_name(GemmOp op) {
    static const char* names[] = {"fwd", "dgrad", "wgrad"};
    return names[static_cast<int>(op)];
}

const char* op_class_name(OpClass c) {
    static const char* names[] = {"rms_norm_eager_fwd",     "rms_norm_eager_bwd",   "cross_entropy",
                                  "adamw_foreach",          "adamw_fused",          "float8_amax_tensorwise",
                                  "float8_cast_tensorwise", "float8_amax_compiled", "float8_cast_compiled"};
    static_assert(sizeof(names) / sizeof(names[0]) == kOpClasses);
    return names[static_cast<int>(c)];
}

void add_work(MetaWork& a, const MetaWork& b, double k) {
    a.gemm_flops += k * b.gemm_flops;
    a.recompute_flops += k * b.recompute_flops;
    a.memory_bytes += k * b.memory_bytes;
    a.kernels += k * b.kernels;
    add_counts(a.gemms, b.gemms, k);
    add_counts(a.attention, b.attention, k);
    add_counts(a.ops, b.ops, k);
}

MetaWork work_since(const MetaWork& before, const MetaWork& after) {
    MetaWork d;
    add_work(d, after, 1);
    add_work(d, before, -1);
    return d;
}

MetaWork work_extrapolated(const MetaWork& a, const MetaWork& b, double k) {
    MetaWork o;
    add_work(o, a, 1 - k);
    add_work(o, b, k);
    return o;
}

// PyTorch's eager kernel sequences, bytes per element (s: the input dtype's size, 4: float32):
//   rms_norm_eager_fwd  x.to(float32) s+4, pow(2) 8, mean 4, x * rsqrt(..) 8, .to(dtype) 4+s,
//                       weight * h 2s (the casts vanish for float32 inputs)
//   rms_norm_eager_bwd  dy * w 2s, dy * h 3s and its sum over rows s, .to(float32) s+4,
//                       g * rstd 8, g * x 12 and its row sum 4, mean's 4, pow's 2x 8 and product 12,
//                       the two x gradients summed 12, .to(dtype) 4+s
//   cross_entropy       .float() s+4, log_softmax 16 (max, sum and write passes over a row), the
//                       nll gradient's zero fill 4, log_softmax's backward 16, the cast back 4+s
//   adamw_foreach       (float32 state) p *= 1 - lr wd 8, lerp_(m, g) 12, v *= b2 8, addcmul_ 12,
//                       sqrt 8, div_ 8, add_ 8, addcdiv_(p, m, denom) 16; scaled by s / 4
//   adamw_fused         p, g, m, v read, p, m, v written: 7s
//   float8_amax_tensorwise  torchao's tensor_to_amax, torch.max(torch.abs(x)): abs 2s, max s; then
//                       amax_to_scale's four kernels on the scalar (to float64, clamp, max / amax,
//                       to float32): no bytes per element
//   float8_cast_tensorwise  torchao's hp_tensor_and_scale_to_float8: x.to(float32) s+4 (none for
//                       float32: no kernel either), * scale 8, clamp 8 (to_fp8_saturated), .to(float8)
//                       4+1
//   float8_amax_compiled    the same under torch.compile (inductor fuses abs and max into one
//                           reduction, the scale into a second small kernel): s, 2 kernels
//                           (assumed from inductor's fusion rules, not measured)
//   float8_cast_compiled    the scaled cast fused, writing the layout torch._scaled_mm takes (no
//                           layout copies): s + 1, 1 kernel (assumed likewise)
double framework_bytes(OpClass op, DType dt) {
    const double s = static_cast<double>(dtype_size(dt));
    const double cast = dt == DType::float32 ? 0 : s + 4;  // to or from float32
    switch (op) {
        case OpClass::rms_norm_eager_fwd:
            return cast + 8 + 4 + 8 + cast + 2 * s;
        case OpClass::rms_norm_eager_bwd:
            return 2 * s + 3 * s + s + cast + 8 + 12 + 4 + 4 + 8 + 12 + 12 + cast;
        case OpClass::cross_entropy:
            return cast + 16 + 4 + 16 + cast;
        case OpClass::adamw_foreach:
            return 80 * s / 4;
        case OpClass::adamw_fused:
            return 7 * s;
        case OpClass::float8_amax_tensorwise:
            return 3 * s;
        case OpClass::float8_cast_tensorwise:
            return cast + 8 + 8 + 4 + 1;
        case OpClass::float8_amax_compiled:
            return s;
        case OpClass::float8_cast_compiled:
            return s + 1;
        default:
            return 0;
    }
}

int framework_kernels(OpClass op, DType dt) {
    static const int kernels[] = {8, 14, 6, 8, 1, 6, 4, 2, 1};
    static_assert(sizeof(kernels) / sizeof(kernels[0]) == kOpClasses);
    const bool no_upcast = op == OpClass::float8_cast_tensorwise && dt == DType::float32;
    return kernels[static_cast<int>(op)] - (no_upcast ? 1 : 0);
}

void meta_count_op(OpClass op, DType dtype, double elements, int kernels) {
    t_work.ops[{op, dtype}] += OpCount{elements, static_cast<double>(kernels)};
}

void meta_count_memory(double bytes, int kernels) {
    t_work.memory_bytes += bytes;
    t_work.kernels += kernels;
}

void meta_repeat(int64_t n, const std::function<void()>& slice) {
    if (n <= 0) return;
    MetaWork before = std::move(t_work);  // moved, not copied: the step's counts so far
    t_work = MetaWork{};                  // the counts start at 0; the modes stay
    t_work.recomputing = before.recomputing, t_work.mode = before.mode;
    slice();
    const MetaWork one = std::move(t_work);
    t_work = std::move(before);
    add_work(t_work, one, static_cast<double>(n));
}

Backend& meta_backend() {
    static MetaBackend meta;
    return meta;
}

}  // namespace ptool
