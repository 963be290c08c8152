#include "model/rope.h"

#include <cmath>

#include "backend/meta/meta_backend.h"
#include "core/memory_account.h"

namespace ptool {

float Rope::inv_freq(int64_t i) const {
    const double f = 1.0 / std::pow(theta_, static_cast<double>(2 * i) / static_cast<double>(hd_));
    if (scaling_.type == "linear") return static_cast<float>(f / scaling_.factor);
    if (scaling_.type != "llama3") return static_cast<float>(f);
    const double pi = 3.14159265358979323846, wavelen = 2 * pi / f;
    const double low_wavelen = scaling_.original_max_position_embeddings / scaling_.low_freq_factor;
    const double high_wavelen = scaling_.original_max_position_embeddings / scaling_.high_freq_factor;
    if (wavelen > low_wavelen) return static_cast<float>(f / scaling_.factor);  // low frequencies
    if (wavelen < high_wavelen) return static_cast<float>(f);                   // high frequencies
    const double smooth = (scaling_.original_max_position_embeddings / wavelen - scaling_.low_freq_factor) /
                          (scaling_.high_freq_factor - scaling_.low_freq_factor);
    return static_cast<float>((1 - smooth) * f / scaling_.factor + smooth * f);
}

Rope::Tables Rope::tables(const Tensor& like, const std::vector<int64_t>* positions) const {
    const int64_t n = like.size(0), t = like.size(1), half = hd_ / 2;
    const bool meta = like.device() == Device::meta;  // shapes only: the same tensors, no values
    // ptool's per-call tables; transformers computes cos and sin once per forward, [batch, t, hd]
    TorchAllocScope own(TorchAlloc::ptool_only);
    const Device host = meta ? Device::meta : Device::cpu;
    Tensor c({t, hd_}, like.dtype(), host), s({t, hd_}, like.dtype(), host),
        m({hd_, hd_}, like.dtype(), host);
    for (int64_t i = 0; i < half && !meta; ++i) {
        // as HF: inv_freq in float32, then position * inv_freq in float32, cos/sin of that
        const float freq = inv_freq(i);
        for (int64_t p = 0; p < t; ++p) {
            const float angle = static_cast<float>(positions ? (*positions)[p] : p) * freq;
            for (int64_t k : {i, i + half})
                c.set(p * hd_ + k, std::cos(angle)), s.set(p * hd_ + k, std::sin(angle));
        }
        m.set(i * hd_ + i + half, -1.0);  // rotate_half: out[i] = -x[i + half], out[i + half] = x[i]
        m.set((i + half) * hd_ + i, 1.0);
    }
    Tables out{Tensor::empty({n, t, hd_}, like.dtype(), like.device()),
               Tensor::empty({n, t, hd_}, like.dtype(), like.device()), m.to_device(like.device())};
    const Tensor cd = c.to_device(like.device()), sd = s.to_device(like.device());
    for (int64_t j = 0; j < n && !meta; ++j) {  // the same table for every head of every batch row
        Tensor co = out.cos.narrow(0, j, 1).reshape({t, hd_}), so = out.sin.narrow(0, j, 1).reshape({t, hd_});
        copy_bytes(co.raw(), like.device(), cd.raw(), like.device(), cd.nbytes());
        copy_bytes(so.raw(), like.device(), sd.raw(), like.device(), sd.nbytes());
    }
    return out;
}

Tensor Rope::forward(Backend& be, const Tensor& x, const std::vector<int64_t>* positions) const {
    if (x.numel() == 0) return x.clone();
    const Tables tb = tables(x, positions);
    Tensor rotated = Tensor::empty(x.shape(), x.dtype(), x.device()),
           a = Tensor::empty(x.shape(), x.dtype(), x.device());
    {
        MetaKernelScope elementwise({.gemm_as_elementwise = true});  // explain's work: a copy, not a GEMM
        be.gemm(x, false, tb.rotate, true, rotated);                 // rotate_half(x)
    }
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    be.mul(x, tb.cos, y);
    be.mul(rotated, tb.sin, a);
    be.add(y, a, y);
    return y;
}

Tensor Rope::backward(Backend& be, const Tensor& dy, const std::vector<int64_t>* positions) const {
    if (dy.numel() == 0) return dy.clone();
    const Tables tb = tables(dy, positions);
    Tensor ds = Tensor::empty(dy.shape(), dy.dtype(), dy.device()),
           dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    be.mul(dy, tb.sin, ds);
    be.mul(dy, tb.cos, dx);
    MetaKernelScope elementwise({.gemm_as_elementwise = true});
    be.gemm(ds, false, tb.rotate, false, dx, 1.0, 1.0);  // + (dy * sin) @ M
    return dx;
}

}  // namespace ptool
