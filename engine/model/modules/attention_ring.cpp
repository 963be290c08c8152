// Context parallelism's ring attention (torch's set_rotate_method("alltoall"), Ring Attention,
// Transformer Engine's p2p cp): each cp rank keeps its own queries; the keys and values travel
// round the cp ring, one rank's block per step, and each step's partial attention is merged into
// the rows' running output by log-sum-exp (the flash kernel's online softmax across blocks):
//
//   step s = 0 .. cp-1: the block of rank (r - s) mod cp; the next block's send/recv is posted
//   before this one's compute (the overlap torch and TE get from async p2p)
//     S = q K^T / sqrt(hd) + mask(query positions, the block's key positions)
//     (p, m_b, l_b) = softmax_stats(S);  o_b = p V;  (o, m, l) = merge((o, m, l), (o_b, m_b, l_b))
//
// Backward recomputes each block's probabilities from the rows' final m and l, and the key and
// value gradients travel with their block: after cp steps each block's gradients hold every
// rank's queries' part, and one more hop returns them to the rank that holds those keys.
// Only the rank's own keys and values are kept for backward (no gathered sequence).
#include <cmath>

#include "comm/comm_stats.h"
#include "comm/communicator.h"
#include "model/blocks.h"
#include "model/modules/attention_heads.h"

namespace ptool {

using namespace attention_heads;

namespace {

// One hop round the ring: each tensor of `out` to the next cp rank, the previous rank's into a
// tensor of the same shape (tags[i] for out[i]). Returns what came in.
std::vector<Tensor> ring_pass(const ContextShard& cp, const std::vector<Tensor>& out,
                              const std::vector<int>& tags) {
    std::vector<Tensor> in;
    in.reserve(out.size());
    std::vector<P2POp> ops;
    for (size_t i = 0; i < out.size(); ++i) {
        in.push_back(empty_like(out[i]));
        ops.push_back({P2POp::Kind::send, const_cast<Tensor*>(&out[i]), cp.next(), tags[i]});
        ops.push_back({P2POp::Kind::recv, &in.back(), cp.prev(), tags[i]});
    }
    cp.comm->batch_isend_irecv(ops);
    return in;
}

// The share of a rank's query x key products its causal mask keeps, over every block: what a
// flash kernel computes (explain's FLOPs), as flash_kernel's (t + 1) / 2t is for one sequence.
MetaKernelMode ring_kernel(const ContextShard& cp, bool causal, const Tensor& q, int64_t keys,
                           bool backward) {
    double seen = 0;
    for (int64_t p : cp.positions) seen += static_cast<double>(p + 1);
    const double all = static_cast<double>(cp.local()) * static_cast<double>(cp.seq);
    return {.gemm_share = causal && all > 0 ? seen / all : 1,
            .on_chip = true,
            .attention = true,
            .attention_key = {backward, q.dtype(), causal, q.size(1), keys, q.size(2)}};
}

// Row statistics of head i, rows [r0, r0 + rows) of m or l [heads, t]: a view [rows].
Tensor stat_rows(const Tensor& s, int64_t i, int64_t r0, int64_t rows) {
    return s.narrow(0, i, 1).reshape({s.size(1)}).narrow(0, r0, rows);
}

}  // namespace

Tensor Attention::ring_forward(RunContext& ctx, const Tensor& q, const Tensor& k_heads, const Tensor& v_heads,
                               HeadCounts h, const Layout& out, Tensor& m, Tensor& l) const {
    Backend& be = *ctx.backend;
    const ContextShard& cp = *ctx.context;
    const int64_t n = h.b * h.heads, t = q.size(1), hd = q.size(2);
    Tensor o({n, t, hd}, q.dtype(), q.device());
    m = Tensor({n, t}, acc_dtype(q.dtype()), q.device()),
    l = Tensor({n, t}, acc_dtype(q.dtype()), q.device());
    be.fill(m, -INFINITY);
    const bool fused_block = fused(be, ctx, q);
    Tensor kb = k_heads, vb = v_heads;
    for (int s = 0; s < cp.parts; ++s) {
        const int src = (cp.rank - s + cp.parts) % cp.parts;
        std::vector<Tensor> next;
        if (s + 1 < cp.parts) {
            CommScope scope(cp.comm->counter().get(), fqn(), {CommSiteKind::context_kv});
            next = ring_pass(cp, {kb, vb}, {ring_keys, ring_values});
        }
        const std::vector<int64_t>& keys = cp.rank_positions[static_cast<size_t>(src)];
        if (fused_block) {  // the block's (o, m, l) from one kernel over every head (attention_fused.cpp)
            Tensor ob = Tensor::empty(o.shape(), o.dtype(), o.device()),
                   mb = Tensor::empty(m.shape(), m.dtype(), m.device()),
                   lb = Tensor::empty(l.shape(), l.dtype(), l.device());
            be.attention_forward(fused_args(h, q, &cp.positions, &keys, false), q, kb, vb, ob, mb, lb);
            be.softmax_merge(o, m, l, ob, mb, lb);
        } else {
            ring_block_forward(be, cp, q, kb, vb, h, keys, o, m, l);
        }
        report_ring_step(ctx, Phase::forward, s, o, h, out);
        if (!next.empty()) kb = next[0], vb = next[1];
    }
    return o;
}

// One block on the tile path, merged into the rows' (o, m, l) head by head, tile by tile.
void Attention::ring_block_forward(Backend& be, const ContextShard& cp, const Tensor& q, const Tensor& kb,
                                   const Tensor& vb, HeadCounts h, const std::vector<int64_t>& keys,
                                   Tensor& o, Tensor& m, Tensor& l) const {
    const int64_t n = h.b * h.heads, t = q.size(1), hd = q.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    const Tensor k = expand_kv(be, kb, h.b, h.heads, h.kv_heads),
                 v = expand_kv(be, vb, h.b, h.heads, h.kv_heads);
    MetaKernelScope kernel(ring_kernel(cp, causal_, q, k.size(1), false));
    each_head(n, o, [&](int64_t i) {
        each_row_tile(t, o, [&](int64_t r0, int64_t rows) {
            Tensor sc = Tensor::empty({1, rows, k.size(1)}, q.dtype(), q.device());
            be.gemm(head_rows(q, i, r0, rows), false, k.narrow(0, i, 1), true, sc, scale);
            if (causal_) be.add(sc, position_mask(cp.positions, r0, rows, keys, sc), sc);
            Tensor p = empty_like(sc), mb({rows}, m.dtype(), m.device()), lb({rows}, l.dtype(), l.device());
            be.softmax_stats(sc, p, mb, lb);
            Tensor ob = Tensor::empty({1, rows, hd}, q.dtype(), q.device()), oi = head_rows(o, i, r0, rows),
                   mi = stat_rows(m, i, r0, rows), li = stat_rows(l, i, r0, rows);
            be.gemm(p, false, v.narrow(0, i, 1), false, ob);
            be.softmax_merge(oi, mi, li, ob, mb, lb);
        });
    });
}

// One block's backward on the tile path: dq added to, the block's dk and dv (per kv head) written.
void Attention::ring_block_backward(Backend& be, const ContextShard& cp, const std::vector<Tensor>& saved,
                                    const Tensor& d_o, HeadCounts h, const Tensor& kb, const Tensor& vb,
                                    const std::vector<int64_t>& keys, Tensor& dq, Tensor& dk_heads,
                                    Tensor& dv_heads) const {
    const Tensor &q = saved[0], &o = saved[3], &m = saved[6], &l = saved[7];
    const int64_t n = h.b * h.heads, t = q.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
    const Tensor k = expand_kv(be, kb, h.b, h.heads, h.kv_heads),
                 v = expand_kv(be, vb, h.b, h.heads, h.kv_heads);
    Tensor dk(k.shape(), k.dtype(), k.device()), dv(v.shape(), v.dtype(), v.device());
    MetaKernelScope kernel(ring_kernel(cp, causal_, q, k.size(1), true));
    each_head(n, q, [&](int64_t i) {
        each_row_tile(t, q, [&](int64_t r0, int64_t rows) {
            const Tensor qi = head_rows(q, i, r0, rows), d_oi = head_rows(d_o, i, r0, rows),
                         oi = head_rows(o, i, r0, rows), ki = k.narrow(0, i, 1), vi = v.narrow(0, i, 1);
            Tensor sc = Tensor::empty({1, rows, k.size(1)}, q.dtype(), q.device());
            const bool was = meta_work().recomputing;  // the block's scores: the kernel's recompute
            meta_work().recomputing = true;
            be.gemm(qi, false, ki, true, sc, scale);
            meta_work().recomputing = was;
            if (causal_) be.add(sc, position_mask(cp.positions, r0, rows, keys, sc), sc);
            Tensor p = empty_like(sc), dp = empty_like(sc), ds = empty_like(sc),
                   dqi = head_rows(dq, i, r0, rows), dki = dk.narrow(0, i, 1), dvi = dv.narrow(0, i, 1);
            be.softmax_from_stats(sc, stat_rows(m, i, r0, rows), stat_rows(l, i, r0, rows), p);
            be.gemm(d_oi, false, vi, true, dp);
            be.gemm(p, true, d_oi, false, dvi, 1.0, 1.0);
            be.softmax_backward_rows(p, dp, oi, d_oi, ds);
            be.gemm(ds, false, ki, false, dqi, scale, 1.0);
            be.gemm(ds, true, qi, false, dki, scale, 1.0);
        });
    });
    dk_heads = reduce_kv(be, dk, h.b, h.heads, h.kv_heads),
    dv_heads = reduce_kv(be, dv, h.b, h.heads, h.kv_heads);
}

void Attention::ring_backward(RunContext& ctx, const std::vector<Tensor>& saved, const Tensor& d_o,
                              HeadCounts h, const Layout& out, Tensor& dq, Tensor& dk_heads,
                              Tensor& dv_heads) const {
    Backend& be = *ctx.backend;
    const ContextShard& cp = *ctx.context;
    const Tensor &q = saved[0], &k_heads = saved[1], &v_heads = saved[2], &o = saved[3], &m = saved[6],
                 &l = saved[7];
    dq = Tensor(q.shape(), q.dtype(), q.device());
    Tensor kb = k_heads, vb = v_heads, dkb(k_heads.shape(), k_heads.dtype(), k_heads.device()),
           dvb(v_heads.shape(), v_heads.dtype(), v_heads.device());
    const bool fused_block = fused(be, ctx, q);
    for (int s = 0; s < cp.parts; ++s) {
        const int src = (cp.rank - s + cp.parts) % cp.parts;
        const std::vector<int64_t>& keys = cp.rank_positions[static_cast<size_t>(src)];
        Tensor dk, dv;    // the block's, per kv head
        if (fused_block)  // dq added to, dk and dv summed over the query heads (attention_fused.cpp)
            dk = empty_like(kb), dv = empty_like(vb),
            be.attention_backward(fused_args(h, q, &cp.positions, &keys, false), q, kb, vb, o, d_o, m, l, dq,
                                  dk, dv, true);
        else
            ring_block_backward(be, cp, saved, d_o, h, kb, vb, keys, dq, dk, dv);
        report_ring_step(ctx, Phase::backward, s, dq, h, out);
        be.axpy(1.0, dk, dkb), be.axpy(1.0, dv, dvb);
        CommScope scope(cp.comm->counter().get(), fqn(), {CommSiteKind::context_kv});
        if (s + 1 < cp.parts) {  // the block moves on with its gradients so far
            std::vector<Tensor> next =
                ring_pass(cp, {kb, vb, dkb, dvb}, {ring_keys, ring_values, ring_key_grads, ring_value_grads});
            kb = next[0], vb = next[1], dkb = next[2], dvb = next[3];
        } else {  // the last hop: each block's gradients home to the rank that holds its keys
            std::vector<Tensor> home = ring_pass(cp, {dkb, dvb}, {ring_return_keys, ring_return_values});
            dkb = home[0], dvb = home[1];
        }
    }
    dk_heads = dkb, dv_heads = dvb;
}

}  // namespace ptool
