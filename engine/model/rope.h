// Rotary position embedding (RoPE) as Hugging Face Llama applies it to q and k: per head,
//   y = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[hd/2:], x[:hd/2])
// with cos/sin of positions 0..T-1 times inv_freq = 1 / theta^(2i/hd), i < hd/2, the frequencies
// repeated for both halves (emb = cat(freqs, freqs)). rotate_half is a signed permutation, applied
// as a GEMM with a +-1 matrix (exact), so the op runs on any backend with the rounding of PyTorch's
// `q * cos + rotate_half(q) * sin`. backward: dx = dy * cos + (dy * sin) @ M, rotate_half(x) = x @ M^T.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"

namespace ptool {

// HF's rope_scaling (transformers' ROPE_INIT_FUNCTIONS): "linear" divides every frequency by
// factor (positions / factor); "llama3" (Llama 3.1+) divides the low frequencies (wavelength over
// original_max_position_embeddings / low_freq_factor) by factor, keeps the high ones (wavelength
// under original / high_freq_factor) and blends those between.
struct RopeScaling {
    std::string type = "none";  // none | linear | llama3
    double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
    double original_max_position_embeddings = 8192;
};

class Rope {
public:
    Rope(double theta, int64_t head_dim, RopeScaling scaling = {})
        : theta_(theta), hd_(head_dim), scaling_(std::move(scaling)) {}
    // inv_freq[i] for i < head_dim / 2, with the scaling applied (float32, as HF keeps it).
    float inv_freq(int64_t i) const;
    double theta() const { return theta_; }
    // x: [N, T, hd] (N = batch x heads), positions 0..T-1 along dim 1, or `positions` (T of them:
    // a context-parallel rank's tokens, model/context_shard.h).
    Tensor forward(Backend& be, const Tensor& x, const std::vector<int64_t>* positions = nullptr) const;
    Tensor backward(Backend& be, const Tensor& dy, const std::vector<int64_t>* positions = nullptr) const;

private:
    struct Tables {
        Tensor cos, sin, rotate;  // [N, T, hd], [N, T, hd], [hd, hd]
    };
    Tables tables(const Tensor& like, const std::vector<int64_t>* positions) const;
    double theta_;
    int64_t hd_;
    RopeScaling scaling_;
};

}  // namespace ptool
