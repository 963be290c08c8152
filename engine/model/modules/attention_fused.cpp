// Attention's flash path as one fused kernel per layer and phase, where the backend has one
// (Backend::fused_attention: the CUDA backend's cuda_flash_attention.cu). The tile path
// (attention.cpp: a head and a tile of query rows at a time, through gemm and softmax) is what the
// CPU and meta run and what the kernel is tested against (tests/attention_oracle.h).
//
// The kernel reads the kv heads as they are (a query head finds its kv head: no expand_kv copies)
// and writes o in merge_heads' layout, which o_proj takes as it is; forward keeps each row's
// softmax statistics (m, l) for backward, which recomputes the scores tile by tile on chip and
// sums dk and dv over the query heads sharing a kv head (no reduce_kv). What is saved is what the
// ring saves (q, k_heads, v_heads, o, heads, kv heads, m, l): o is o_proj's input, which o_proj
// keeps anyway; m and l are [B*H, T] floats each.
#include <algorithm>
#include <cmath>

#include "model/blocks.h"
#include "model/modules/attention_heads.h"

namespace ptool {
namespace {

// Positions as an int64 tensor on like's device (the kernel reads them there).
Tensor positions_on(const std::vector<int64_t>& p, const Tensor& like) {
    Tensor h({static_cast<int64_t>(p.size())}, DType::int64);
    std::copy(p.begin(), p.end(), h.data<int64_t>());
    return like.device() == Device::cpu ? h : h.to_device(like.device());
}

}  // namespace

bool Attention::fused(const Backend& be, const RunContext& ctx, const Tensor& q) const {
    // the reference beside a ring plan computes the ring's steps from the tile path's pieces
    return q.device() != Device::meta && !(ctx.observer && ctx.ring_probe) &&
           be.fused_attention(q.dtype(), q.size(2));
}

AttentionArgs Attention::fused_args(HeadCounts h, const Tensor& like, const std::vector<int64_t>* queries,
                                    const std::vector<int64_t>* keys, bool o_merged) const {
    AttentionArgs a;
    a.batch = h.b, a.heads = h.heads, a.kv_heads = h.kv_heads;
    a.scale = 1.0 / std::sqrt(static_cast<double>(hd_));
    a.causal = causal_;
    if (causal_ && queries) a.query_pos = positions_on(*queries, like);
    if (causal_ && keys) a.key_pos = positions_on(*keys, like);
    a.o_merged = o_merged;
    return a;
}

// q [B*H, t, hd]; k_heads, v_heads [B*KV, T, hd] (under context parallelism every rank's keys, in
// position order, and the queries at this rank's positions).
Placed Attention::fused_forward(RunContext& ctx, const Placed& q_flat, const Tensor& q, const Tensor& k_heads,
                                const Tensor& v_heads, HeadCounts h, const ContextShard* cp,
                                KeptOutput kept) {
    Backend& be = *ctx.backend;
    const int64_t t = q.size(1);
    const Shape o_global{q_flat.global[0], q_flat.global[1], q_flat.global[2]};
    Tensor o, m, l;
    if (kept == KeptOutput::take) {  // in the order kept: o last, where a stale-output fault finds it
        m = kept_.take(ctx), l = kept_.take(ctx), o = kept_.take(ctx);
    } else {
        o = Tensor::empty({h.b, t, h.heads * hd_}, q.dtype(), q.device());
        m = Tensor::empty({h.b * h.heads, t}, acc_dtype(q.dtype()), q.device());
        l = Tensor::empty({h.b * h.heads, t}, acc_dtype(q.dtype()), q.device());
        be.attention_forward(fused_args(h, q, cp ? &cp->positions : nullptr, nullptr, true), q, k_heads,
                             v_heads, o, m, l);
        if (kept == KeptOutput::keep) kept_.keep(ctx, m), kept_.keep(ctx, l), kept_.keep(ctx, o);
    }
    save({q, k_heads, v_heads, o, Tensor::scalar(static_cast<double>(h.heads), DType::float64),
          Tensor::scalar(static_cast<double>(h.kv_heads), DType::float64), m, l});
    return proj(3).forward(ctx, {o, q_flat.p, o_global});
}

// d_o: o_proj's input gradient [B, t, H*hd]; dq [B*H, t, hd], dk_heads and dv_heads [B*KV, T, hd]
// (every rank's keys under context parallelism: the caller scatters them).
void Attention::fused_backward(Backend& be, const std::vector<Tensor>& saved, const Tensor& d_o, HeadCounts h,
                               const ContextShard* cp, Tensor& dq, Tensor& dk_heads, Tensor& dv_heads) const {
    const Tensor &q = saved[0], &k_heads = saved[1], &v_heads = saved[2], &o = saved[3], &m = saved[6],
                 &l = saved[7];
    dq = empty_like(q), dk_heads = empty_like(k_heads), dv_heads = empty_like(v_heads);
    be.attention_backward(fused_args(h, q, cp ? &cp->positions : nullptr, nullptr, true), q, k_heads, v_heads,
                          o, d_o, m, l, dq, dk_heads, dv_heads, false);
}

}  // namespace ptool
