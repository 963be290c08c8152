// The CUDA backend's class (private to backend/cuda): the Backend interface, one .cu file per
// family of ops as on the CPU (cuda_gemm, cuda_elementwise, cuda_norm, cuda_attention_loss).
#pragma once

#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "backend/op_shapes.h"

namespace ptool {

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(const CudaOptions& options) : options_(options) {}
    Device device() const override { return Device::cuda; }
    std::string name() const override;
    void synchronize() override { cuda_synchronize_current_stream(); }

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
    void draw_init(Tensor& t, const InitDraw& d) override;  // cuda_init_draw.cu

    bool fused_attention(DType dt, int64_t head_dim) const override;  // cuda_flash_attention.cu
    void attention_forward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                           Tensor& o, Tensor& m, Tensor& l) override;
    void attention_backward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& o, const Tensor& d_o, const Tensor& m, const Tensor& l, Tensor& dq,
                            Tensor& dk, Tensor& dv, bool accumulate_dq) override;

    double cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double divisor,
                         Tensor& dlogits) override;
    double mse(const Tensor& out, const Tensor& target, double divisor, Tensor& dout) override;

    void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buf, double lr, double momentum,
                  double weight_decay, bool first_step) override;
    void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step, double lr,
                    double beta1, double beta2, double eps, double weight_decay) override;

private:
    CudaOptions options_;
};

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options);

}  // namespace ptool
