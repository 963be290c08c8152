// Backend: the handful of compute operations the modules call, one implementation per device.
//
// CPU (backend/cpu, OpenBLAS + loops) is the oracle; the CUDA backend (backend/cuda) implements
// the same interface and is tested against it op by op. Shapes are in the comments:
// every op takes contiguous tensors. "acc" = accumulate into the output (+=) instead of writing.
#pragma once

#include <string>

#include "core/tensor.h"

namespace ptool {

enum class Activation { relu, gelu, gelu_tanh, silu, tanh };

class Backend {
public:
    virtual ~Backend() = default;
    virtual Device device() const = 0;
    virtual std::string name() const = 0;  // "cpu (OpenBLAS 0.3.21)"
    virtual void synchronize() {}          // waits for the calling thread's queued work (GPU)

    // c = alpha * op(a) @ op(b) + beta * c. a: [batch.., M, K] (or [.., K, M] if trans_a),
    // b: [batch.., K, N] (or [.., N, K] if trans_b) or 2-D (shared by every batch), c: [batch.., M, N].
    virtual void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                      double alpha = 1.0, double beta = 0.0) = 0;

    // Elementwise. out may alias an input.
    virtual void activation(Activation act, const Tensor& x, Tensor& y) = 0;
    virtual void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
    virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
    virtual void mul(const Tensor& a, const Tensor& b, Tensor& out) = 0;
    virtual void axpy(double alpha, const Tensor& x, Tensor& y) = 0;  // y += alpha * x
    virtual void scale(const Tensor& x, double s, Tensor& out) = 0;
    virtual void fill(Tensor& t, double value) = 0;
    virtual void copy(const Tensor& src, Tensor& dst) = 0;  // converts dtype

    // y: [rows, n] += bias: [n];  db: [n] (+)= sum over rows of dy: [rows, n]
    virtual void add_bias(Tensor& y, const Tensor& bias) = 0;
    virtual void sum_rows(const Tensor& dy, Tensor& db, bool acc) = 0;
    virtual double sum_all(const Tensor& x) = 0;  // accumulated in double

    // Norms over the last dim (layer_norm, rms_norm) or over rows per channel (batch_norm, x: [N, C]).
    // weight/bias may be undefined tensors (elementwise_affine=False). mean/rstd: [rows] or [C], float32.
    virtual void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool rms,
                            Tensor& y, Tensor& mean, Tensor& rstd) = 0;
    virtual void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dy, bool rms, Tensor& dx, Tensor* dw,
                                     Tensor* db) = 0;  // dw, db accumulate
    // Per-channel moments of x: [N, C] -> mean [C], biased var [C] (float32 for 16-bit inputs).
    virtual void channel_moments(const Tensor& x, Tensor& mean, Tensor& var) = 0;
    virtual void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                  const Tensor& b, Tensor& y) = 0;
    // Per-channel sum(dy) and sum(dy * xhat): [C] each, what the backward needs (and sync BN reduces).
    virtual void batch_norm_grad_sums(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& dy, Tensor& sum_dy, Tensor& sum_dy_xhat) = 0;
    // dx = w*rstd*(dy - sum_dy/count - xhat*sum_dy_xhat/count)
    virtual void batch_norm_backward_input(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                           const Tensor& w, const Tensor& dy, const Tensor& sum_dy,
                                           const Tensor& sum_dy_xhat, double count, Tensor& dx) = 0;

    // ids: [...] int64/int32, w: [V, D], y: [..., D]; backward accumulates into dw. A negative id
    // is a row another rank holds (vocab-parallel embedding): zeros forward, skipped backward.
    virtual void embedding(const Tensor& ids, const Tensor& w, Tensor& y) = 0;
    virtual void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dw) = 0;

    // Attention helpers. x: [A, B, C, D] -> y: [A, C, B, D].
    virtual void transpose12(const Tensor& x, Tensor& y) = 0;
    // Row softmax over the last dim of x: [.., T, S]; causal masks s > t (+ S - T offset).
    virtual void softmax(const Tensor& x, bool causal, Tensor& y) = 0;
    virtual void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;
    // A flash kernel's row softmax in blocks of keys (ring attention, model/modules/attention_ring.cpp).
    // m (the row's max) and l (its sum of exp(x - m)): [rows], float32 (float64 for float64 x); a row
    // whose every score is -inf has m = -inf, l = 0 and probabilities 0.
    // softmax_stats: y = softmax(x) per row, with its m and l.
    virtual void softmax_stats(const Tensor& x, Tensor& y, Tensor& m, Tensor& l) = 0;
    // softmax_merge: rows o [rows, hd] (m, l) merged with another block's o_b (m_b, l_b) by the
    // log-sum-exp rule: M = max(m, m_b), a = l e^(m - M), b = l_b e^(m_b - M), o = (a o + b o_b) /
    // (a + b), m = M, l = a + b (rows where a + b = 0 stay 0).
    virtual void softmax_merge(Tensor& o, Tensor& m, Tensor& l, const Tensor& o_b, const Tensor& m_b,
                               const Tensor& l_b) = 0;
    // softmax_from_stats: y = exp(x - m) / l per row (0 where l = 0): one block's probabilities under
    // the whole row's statistics.
    virtual void softmax_from_stats(const Tensor& x, const Tensor& m, const Tensor& l, Tensor& y) = 0;
    // softmax_backward_rows: dx = y * (dy - D), D = sum(o * d_o) per row (o, d_o: [rows, hd], the
    // attention's output and its gradient): softmax_backward of one block of a row's keys.
    virtual void softmax_backward_rows(const Tensor& y, const Tensor& dy, const Tensor& o, const Tensor& d_o,
                                       Tensor& dx) = 0;

    // Losses return the sum over their items divided by `divisor` and write d(loss)/d(input)
    // (upstream gradient 1). cross_entropy's items are the rows whose target is not ignore_index
    // (those rows' loss and gradient are 0), mse's the elements: with divisor = the call's own item
    // count this is reduction='mean' (and, as PyTorch's, NaN when there is none: 0 / 0); the
    // loss_normalization global_tokens divides by the step's count over every rank (model/loss.h).
    virtual double cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 double divisor, Tensor& dlogits) = 0;
    virtual double mse(const Tensor& out, const Tensor& target, double divisor, Tensor& dout) = 0;

    // Optimizer steps, torch.optim's update order. Buffers are in the parameter's dtype.
    virtual void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buf, double lr, double momentum,
                          double weight_decay, bool first_step) = 0;
    virtual void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step,
                            double lr, double beta1, double beta2, double eps, double weight_decay) = 0;
};

// How the process's backends are set up; call before the first backend_for(Device::cuda).
struct BackendOptions {
    bool tf32 = false;    // --tf32: allow TF32 tensor-core math in fp32 GEMMs (off: bitwise-stable fp32)
    int cuda_device = 0;  // the GPU this process uses
};
void configure_backends(const BackendOptions& options);
Backend& backend_for(Device device);  // cuda: RuntimeError when the build or the machine has no GPU

// t in dtype dt on its device: t itself when it already is, else a converted copy (round to nearest even).
Tensor to_dtype(Backend& be, const Tensor& t, DType dt);

}  // namespace ptool
