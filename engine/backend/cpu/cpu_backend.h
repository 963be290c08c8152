// The CPU backend: OpenBLAS for GEMM, plain loops for everything else. It is the oracle every
// other backend is tested against, so clarity beats speed except in gemm.
#pragma once

#include <algorithm>

#include "backend/backend.h"
#include "backend/op_shapes.h"

namespace ptool {

// OpenBLAS threads per GEMM while `ranks` ranks (rank threads of this process, or processes of one
// node under mpirun) share the machine's cores: the cores OpenBLAS would use alone, divided among
// them, at least one. Two rank threads each starting OpenBLAS's two threads on two cores spent a
// tenth of a DDP verify yielding (perf). Restores the count on destruction. A GEMM's last bits
// can depend on the thread count (`ptool run models/gemm_mlp.yaml --dump` differs between
// OPENBLAS_NUM_THREADS=1 and 2): runs are reproducible on one machine in one mode, and compared
// with tolerances across them.
// `rank_threads` of them are threads of this process (the others other processes of the node): a
// limit on the address space must leave room for OpenBLAS's buffers of those that may compute at
// once, else exit 3 (require_blas_address_space in cpu_gemm.cpp).
class GemmThreadShare {
public:
    GemmThreadShare(int ranks, int rank_threads);
    ~GemmThreadShare();
    GemmThreadShare(const GemmThreadShare&) = delete;
    GemmThreadShare& operator=(const GemmThreadShare&) = delete;
    static int threads_for(int cores, int ranks) { return ranks > 1 ? std::max(1, cores / ranks) : cores; }

private:
    int saved_;
};

class CpuBackend final : public Backend {
public:
    Device device() const override { return Device::cpu; }
    std::string name() const override;

    void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha,
              double beta) override;

    void activation(Activation act, const Tensor& x, Tensor& y) override;
    void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) override;
    void add(const Tensor& a, const Tensor& b, Tensor& out) override;
    void mul(const Tensor& a, const Tensor& b, Tensor& out) override;
    void axpy(double alpha, const Tensor& x, Tensor& y) override;
    void scale(const Tensor& x, double s, Tensor& out) override;
    void fill(Tensor& t, double value) override;
    void gated_activation(Activation act, const Tensor& g, const Tensor& u, Tensor& a, Tensor& h) override;
    void gated_activation_backward(Activation act, const Tensor& g, const Tensor& a, const Tensor& u,
                                   const Tensor& dh, Tensor& du, Tensor& dg) override;
    void copy(const Tensor& src, Tensor& dst) override;

    void add_bias(Tensor& y, const Tensor& bias) override;
    void sum_rows(const Tensor& dy, Tensor& db, bool acc) override;
    double sum_all(const Tensor& x) override;

    void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool rms, Tensor& y,
                    Tensor& mean, Tensor& rstd) override;
    void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, bool rms, Tensor& dx, Tensor* dw, Tensor* db) override;
    void channel_moments(const Tensor& x, Tensor& mean, Tensor& var) override;
    void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                          const Tensor& b, Tensor& y) override;
    void batch_norm_grad_sums(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                              Tensor& sum_dy, Tensor& sum_dy_xhat) override;
    void batch_norm_backward_input(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                   const Tensor& dy, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                                   double count, Tensor& dx) override;

    void embedding(const Tensor& ids, const Tensor& w, Tensor& y) override;
    void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dw) override;

    void transpose12(const Tensor& x, Tensor& y) override;
    void softmax(const Tensor& x, bool causal, Tensor& y) override;
    void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
    void softmax_stats(const Tensor& x, Tensor& y, Tensor& m, Tensor& l) override;
    void softmax_merge(Tensor& o, Tensor& m, Tensor& l, const Tensor& o_b, const Tensor& m_b,
                       const Tensor& l_b) override;
    void softmax_from_stats(const Tensor& x, const Tensor& m, const Tensor& l, Tensor& y) override;
    void softmax_backward_rows(const Tensor& y, const Tensor& dy, const Tensor& o, const Tensor& d_o,
                               Tensor& dx) override;
    void draw_init(Tensor& t, const InitDraw& d) override;  // cpu_init_draw.cpp: on every core

    double cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double divisor,
                         Tensor& dlogits) override;
    double mse(const Tensor& out, const Tensor& target, double divisor, Tensor& dout) override;

    void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buf, double lr, double momentum,
                  double weight_decay, bool first_step) override;
    void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step, double lr,
                    double beta1, double beta2, double eps, double weight_decay) override;
};

}  // namespace ptool
