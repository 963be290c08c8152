// Backend::attention_forward / attention_backward's contract computed through a backend's plain ops,
// head by head and tile by tile of 128 query rows, as the CPU's flash path computes attention
// (model/modules/attention.cpp and attention_ring.cpp's block step): the scores by gemm, the mask
// added, softmax_stats, then p v; backward from the rows' m and l with softmax_from_stats and
// softmax_backward_rows. The oracle of the CUDA kernels (test_cuda_backend) and of the engine's
// fused path on the CPU (test_attention_fused).
#pragma once

#include <cmath>
#include <vector>

#include "backend/backend.h"

namespace ptool::testing {

// How far a row's sum l = sum_j exp(s_j - m) may lie from a kernel's that keeps the scores in float,
// where the oracle in bfloat16 rounds each score s_j to it (unit roundoff u = 2^-8): each exponent
// moves by at most u (|s_j| + |m|) <= u (2 |m| + d_j) with d_j = m - s_j >= 0, so |l - l'| <= u sum_j
// (2 |m| + d_j) e^-(1-u)d_j e^(2u|m|) <= u (2 |m| n^u l + n / (e (1 - u))) e^(2u|m|) over the row's
// n keys (sum_j e^-(1-u)d_j <= n^u l^(1-u) <= n^u l, as l >= 1; d e^-(1-u)d <= 1 / (e (1 - u))), plus
// float32's own rounding of the sum. A row that sees no key (m not finite): l 0 both, bound 0.
inline double bf16_row_sum_bound(double m, double l, int64_t keys) {
    if (!std::isfinite(m)) return 0.0;
    const double u = std::ldexp(1.0, -8), n = static_cast<double>(keys);
    return u * (2 * std::abs(m) * std::pow(n, u) * l + n / (std::exp(1.0) * (1 - u))) *
               std::exp(2 * u * std::abs(m)) +
           1e-5 * l;
}

// [B*H, T, hd] from [B, T, H*hd] and back (o and d_o under AttentionArgs::o_merged)
inline Tensor split_layout(Backend& be, const Tensor& x, int64_t b, int64_t heads) {
    const int64_t t = x.numel() / (b * x.size(-1)), hd = x.size(-1) / heads;
    Tensor y = Tensor::empty({b, heads, t, hd}, x.dtype(), x.device());
    be.transpose12(x.reshape({b, t, heads, hd}), y);
    return y.reshape({b * heads, t, hd});
}
inline Tensor merged_layout(Backend& be, const Tensor& x, int64_t b, int64_t heads) {
    const int64_t t = x.size(1), hd = x.size(2);
    Tensor y = Tensor::empty({b, t, heads, hd}, x.dtype(), x.device());
    be.transpose12(x.reshape({b, heads, t, hd}), y);
    return y.reshape({b, t, heads * hd});
}

struct OracleTile {
    int64_t head, kv, r0, rows;
};

// The positions of AttentionArgs (host copies), defaults filled in.
inline std::vector<int64_t> positions_of(const Tensor& pos, int64_t n, int64_t offset) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    const Tensor h = pos.defined() ? pos.to_device(Device::cpu) : Tensor();
    for (int64_t i = 0; i < n; ++i)
        p[static_cast<size_t>(i)] = h.defined() ? h.data<int64_t>()[i] : i + offset;
    return p;
}

// body(tile) for every head and tile of 128 query rows; kv_of maps a query head to its kv head
template <class F>
void each_oracle_tile(const AttentionArgs& a, int64_t t, F&& body, bool gqa_as_modulo = false) {
    const int64_t group = a.heads / a.kv_heads;
    for (int64_t bh = 0; bh < a.batch * a.heads; ++bh) {
        const int64_t b = bh / a.heads, h = bh % a.heads;
        const int64_t kv = b * a.kv_heads + (gqa_as_modulo ? h % a.kv_heads : h / group);
        for (int64_t r0 = 0; r0 < t; r0 += 128) body(OracleTile{bh, kv, r0, std::min<int64_t>(128, t - r0)});
    }
}

// Rows [r0, r0 + n) of slice i of x [N, T, hd]: a view [1, n, hd].
inline Tensor oracle_rows(const Tensor& x, int64_t i, int64_t r0, int64_t n) {
    return x.narrow(0, i, 1).reshape({x.size(1), x.size(2)}).narrow(0, r0, n).reshape({1, n, x.size(2)});
}

// The tile's scores, masked: [1, rows, S]
inline Tensor oracle_scores(Backend& be, const AttentionArgs& a, const Tensor& q, const Tensor& k,
                            const OracleTile& tile, const std::vector<int64_t>& qp,
                            const std::vector<int64_t>& kp) {
    const int64_t s = k.size(1);
    Tensor sc = Tensor::empty({1, tile.rows, s}, q.dtype(), q.device());
    be.gemm(oracle_rows(q, tile.head, tile.r0, tile.rows), false, k.narrow(0, tile.kv, 1), true, sc, a.scale);
    if (!a.causal) return sc;
    Tensor mask({1, tile.rows, s}, q.dtype());
    for (int64_t i = 0; i < tile.rows; ++i)
        for (int64_t j = 0; j < s; ++j)
            mask.set(i * s + j,
                     kp[static_cast<size_t>(j)] <= qp[static_cast<size_t>(tile.r0 + i)] ? 0.0 : -INFINITY);
    be.add(sc, q.device() == Device::cpu ? mask : mask.to_device(q.device()), sc);
    return sc;
}

// o [B*H, T, hd] (split layout), m and l [B*H, T]
inline void oracle_forward(Backend& be, const AttentionArgs& a, const Tensor& q, const Tensor& k,
                           const Tensor& v, Tensor& o, Tensor& m, Tensor& l, bool gqa_as_modulo = false) {
    const int64_t t = q.size(1), s = k.size(1);
    const std::vector<int64_t> qp = positions_of(a.query_pos, t, s - t), kp = positions_of(a.key_pos, s, 0);
    each_oracle_tile(
        a, t,
        [&](const OracleTile& tile) {
            const Tensor sc = oracle_scores(be, a, q, k, tile, qp, kp);
            Tensor p = Tensor::empty(sc.shape(), sc.dtype(), sc.device());
            Tensor mi = m.narrow(0, tile.head, 1).reshape({t}).narrow(0, tile.r0, tile.rows),
                   li = l.narrow(0, tile.head, 1).reshape({t}).narrow(0, tile.r0, tile.rows),
                   oi = oracle_rows(o, tile.head, tile.r0, tile.rows);
            be.softmax_stats(sc, p, mi, li);
            be.gemm(p, false, v.narrow(0, tile.kv, 1), false, oi);
        },
        gqa_as_modulo);
}

// dq (+)= ..., dk and dv [B*KV, S, hd] written; o and d_o in split layout
inline void oracle_backward(Backend& be, const AttentionArgs& a, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& o, const Tensor& d_o, const Tensor& m,
                            const Tensor& l, Tensor& dq, Tensor& dk, Tensor& dv, bool accumulate_dq,
                            bool gqa_as_modulo = false) {
    const int64_t t = q.size(1), s = k.size(1);
    const std::vector<int64_t> qp = positions_of(a.query_pos, t, s - t), kp = positions_of(a.key_pos, s, 0);
    be.fill(dk, 0.0), be.fill(dv, 0.0);
    if (!accumulate_dq) be.fill(dq, 0.0);
    each_oracle_tile(
        a, t,
        [&](const OracleTile& tile) {
            const Tensor sc = oracle_scores(be, a, q, k, tile, qp, kp);
            const Tensor qi = oracle_rows(q, tile.head, tile.r0, tile.rows),
                         d_oi = oracle_rows(d_o, tile.head, tile.r0, tile.rows),
                         oi = oracle_rows(o, tile.head, tile.r0, tile.rows), ki = k.narrow(0, tile.kv, 1),
                         vi = v.narrow(0, tile.kv, 1);
            Tensor p = Tensor::empty(sc.shape(), sc.dtype(), sc.device()),
                   dp = Tensor::empty(sc.shape(), sc.dtype(), sc.device()),
                   ds = Tensor::empty(sc.shape(), sc.dtype(), sc.device()),
                   dqi = oracle_rows(dq, tile.head, tile.r0, tile.rows), dki = dk.narrow(0, tile.kv, 1),
                   dvi = dv.narrow(0, tile.kv, 1);
            be.softmax_from_stats(sc, m.narrow(0, tile.head, 1).reshape({t}).narrow(0, tile.r0, tile.rows),
                                  l.narrow(0, tile.head, 1).reshape({t}).narrow(0, tile.r0, tile.rows), p);
            be.gemm(d_oi, false, vi, true, dp);
            be.gemm(p, true, d_oi, false, dvi, 1.0, 1.0);
            be.softmax_backward_rows(p, dp, oi, d_oi, ds);
            be.gemm(ds, false, ki, false, dqi, a.scale, 1.0);
            be.gemm(ds, true, qi, false, dki, a.scale, 1.0);
        },
        gqa_as_modulo);
}

}  // namespace ptool::testing
