#include "backend/meta/meta_backend.h"

namespace ptool {
namespace {

thread_local MetaWork t_work;

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

    void gemm(const Tensor& a, bool trans_a, const Tensor&, bool, Tensor& c, double, double beta) override {
        if (t_work.mode.gemm_as_elementwise) return touch({&a, &c, beta != 0 ? &c : nullptr});
        const int64_t k = trans_a ? a.size(-2) : a.size(-1);
        const double flops =
            2.0 * static_cast<double>(c.numel()) * static_cast<double>(k) * t_work.mode.gemm_share;
        t_work.gemm_flops += flops;
        if (t_work.recomputing) t_work.recompute_flops += flops;
        if (!t_work.mode.on_chip) ++t_work.kernels;
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

MetaWork work_since(const MetaWork& before, const MetaWork& after) {
    MetaWork d;
    d.gemm_flops = after.gemm_flops - before.gemm_flops;
    d.recompute_flops = after.recompute_flops - before.recompute_flops;
    d.memory_bytes = after.memory_bytes - before.memory_bytes;
    d.kernels = after.kernels - before.kernels;
    return d;
}

void meta_repeat(int64_t n, const std::function<void()>& slice) {
    if (n <= 0) return;
    const MetaWork before = t_work;
    t_work = MetaWork{};  // the counts start at 0; the modes stay
    t_work.recomputing = before.recomputing, t_work.mode = before.mode;
    slice();
    const MetaWork one = t_work;
    const double k = static_cast<double>(n);
    t_work = before;
    t_work.gemm_flops += k * one.gemm_flops;
    t_work.recompute_flops += k * one.recompute_flops;
    t_work.memory_bytes += k * one.memory_bytes;
    t_work.kernels += n * one.kernels;
}

Backend& meta_backend() {
    static MetaBackend meta;
    return meta;
}

}  // namespace ptool
