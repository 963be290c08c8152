// Backend: the handful of compute operations the modules call, one implementation per device.
//
// CPU (backend/cpu, OpenBLAS + loops) is the oracle; the CUDA backend (backend/cuda) implements
// the same interface and is tested against it op by op. Shapes are in the comments:
// every op takes contiguous tensors. "acc" = accumulate into the output (+=) instead of writing.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace ptool {

enum class Activation { relu, gelu, gelu_tanh, silu, tanh };

// Parameter initialisation from the counter-based RNG (core/rng.h) for Backend::draw_init: t is the
// box at `offset` along one dim of a whole tensor whose dim holds `full_len` and whose later dims
// `inner` elements; local element i, in runs of `run` (t's length along the dim x inner), takes the
// value drawn at the whole tensor's index (i / run x full_len + offset) x inner + i % run, from
// CounterRng(seed, stream): normal: scale x normal(index); else -scale + 2 scale x uniform(index);
// rounded once to t's dtype. A whole tensor: run = its numel, offset 0.
struct InitDraw {
    uint64_t seed = 0, stream = 0;
    bool normal = false;
    double scale = 1.0;
    int64_t run = 0, full_len = 1, inner = 1, offset = 0;
};

// One attention call's shape and mask for Backend::attention_forward / attention_backward.
struct AttentionArgs {
    int64_t batch = 0, heads = 0, kv_heads = 0;  // B, H, KV (H a multiple of KV)
    double scale = 1.0;                          // of the scores: 1 / sqrt(hd)
    // causal: key j is seen by query i where key_pos[j] <= query_pos[i]; positions int64 on the
    // tensors' device, [T] and [S]; undefined: query i at i + S - T (the last query with the last
    // key, as softmax's causal flag), key j at j
    bool causal = false;
    Tensor query_pos, key_pos;
    bool o_merged = false;  // o and d_o in [B, T, H*hd]
};

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
    // A gated MLP's activation (SwiGLU): a = act(g), h = a * u, each rounded to the dtype as
    // activation then mul round them, in one pass (one kernel on the GPU)
    virtual void gated_activation(Activation act, const Tensor& g, const Tensor& u, Tensor& a, Tensor& h) = 0;
    // Its backward from dh in one pass: du = dh * a; dg = act'(g) * (dh * u, rounded to the dtype),
    // as mul, mul and activation_backward round them
    virtual void gated_activation_backward(Activation act, const Tensor& g, const Tensor& a, const Tensor& u,
                                           const Tensor& dh, Tensor& du, Tensor& dg) = 0;
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

    // t's values as InitDraw says, bitwise the same on every backend (the CPU draws on its cores).
    virtual void draw_init(Tensor& t, const InitDraw& d) = 0;

    // Flash attention as one kernel over every head and query row (a backend that has one: CUDA;
    // the CPU runs attention tile by tile through the ops above, model/modules/attention.cpp, and
    // that is the oracle these are tested against). q [B*H, T, hd]; k, v [B*KV, S, hd], query head
    // h of batch row b reading kv head h / (H / KV); o and d_o [B*H, T, hd], or [B, T, H*hd] (merge_heads'
    // layout) under AttentionArgs::o_merged; m and l [B*H, T] in the accumulate dtype, as softmax_stats'.
    // Whether this backend runs the kernels for that dtype and head dim:
    virtual bool fused_attention(DType, int64_t /*head_dim*/) const { return false; }
    // o = softmax(scale q k^T, keys the mask hides at -inf) v, with each row's m and l (a row that
    // sees no key: m -inf, l 0, o 0).
    virtual void attention_forward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                                   Tensor& o, Tensor& m, Tensor& l);
    // From the forward's o, m and l: with p = exp(s - m) / l and D = sum(o * d_o) per row,
    // ds = p (d_o v^T - D); dq = scale ds k (added to dq when accumulate_dq), dk = scale ds^T q and
    // dv = p^T d_o summed over the query heads sharing each kv head (written).
    virtual void attention_backward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& o, const Tensor& d_o, const Tensor& m, const Tensor& l,
                                    Tensor& dq, Tensor& dk, Tensor& dv, bool accumulate_dq);

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
