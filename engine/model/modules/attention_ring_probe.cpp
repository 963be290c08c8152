// Where inside the ring a context-parallel attention first goes wrong: each ring step's values as
// events, on both sides (verify's localisation, verify/report.cpp).
//
// The ring (attention_ring.cpp) reports, after step s of its forward, the rows' output merged over
// the blocks it has seen: rank r's queries against the keys of ranks r, r-1, ..., r-s (mod cp); and
// after step s of its backward, the rows' query gradient summed over the same blocks. The reference
// on one device holds the whole sequence, and is given the plan's cp layout (RunContext::ring_probe):
// it computes the same values by masking each query to the keys its rank has seen by step s
//
//   forward   o_s  = softmax(q k^T / sqrt(hd) + mask_s) v       (mask_s: -inf outside the blocks)
//   backward  dq_s = (dS . seen_s) k / sqrt(hd),  dS = P . (dP - rowsum(P . dP)),  dP = do v^T
//
// where P is the whole softmax: the ring's backward recomputes each block's probabilities from the
// rows' final statistics, so its dq after step s is the whole row's dS restricted to those blocks.
// Every query sees its own position at step 0 (its own block), so no row is empty.
#include <cmath>

#include "fmt/format.h"
#include "model/blocks.h"
#include "model/context_shard.h"
#include "model/modules/attention_heads.h"

namespace ptool {

using namespace attention_heads;

namespace {

// The cp rank that holds each position of the sequence.
std::vector<int> owners(const ContextShard& ring) {
    std::vector<int> owner(static_cast<size_t>(ring.seq), 0);
    for (int r = 0; r < ring.parts; ++r)
        for (int64_t p : ring.rank_positions[static_cast<size_t>(r)]) owner[static_cast<size_t>(p)] = r;
    return owner;
}

// Whether query position i has met key position j by ring step s: j's block is its own rank's or
// one of the s before it round the ring, and (causal) j <= i.
bool seen_by(const std::vector<int>& owner, int parts, bool causal, int step, int64_t i, int64_t j) {
    const int behind = (owner[static_cast<size_t>(i)] - owner[static_cast<size_t>(j)] + parts) % parts;
    return behind <= step && (!causal || j <= i);
}

}  // namespace

void Attention::report_ring_step(RunContext& ctx, Phase phase, int step, const Tensor& heads, HeadCounts h,
                                 const Layout& out) const {
    if (!ctx.observer) return;
    const int steps = ctx.context ? ctx.context->parts : ctx.ring_probe->parts;
    const std::string part = fmt::format("{} at ring step {} of {}",
                                         phase == Phase::forward ? "output" : "query gradient", step, steps);
    ctx.observer(sub_event(fqn(), part), phase, ctx.microbatch,
                 {merge_heads(*ctx.backend, heads, h.b, h.heads), out.p, out.global});
}

void Attention::report_ring_kv_grads(RunContext& ctx, const Tensor& dk_heads, const Tensor& dv_heads,
                                     HeadCounts h, const Layout& out) const {
    if (!ctx.observer) return;
    const Shape kv_global{out.global[0], out.global[1], hd_ * kv_heads_};
    for (const auto& [what, d] : {std::pair{"key", &dk_heads}, std::pair{"value", &dv_heads}})
        ctx.observer(sub_event(fqn(), fmt::format("{} gradient after the ring's return hop", what)),
                     Phase::backward, ctx.microbatch,
                     {merge_heads(*ctx.backend, *d, h.b, h.kv_heads), out.p, kv_global});
}

void Attention::probe_ring_forward(RunContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                                   HeadCounts h, const Layout& out) const {
    Backend& be = *ctx.backend;
    const ContextShard& ring = *ctx.ring_probe;
    const std::vector<int> owner = owners(ring);
    const int64_t n = h.b * h.heads, t = q.size(1);
    for (int s = 0; s < ring.parts; ++s) {
        const Tensor mask = visible_mask(
            t, t, q, [&](int64_t i, int64_t j) { return seen_by(owner, ring.parts, causal_, s, i, j); }, 0.0,
            -INFINITY);
        Tensor o({n, t, q.size(2)}, q.dtype(), q.device());
        for (int64_t i = 0; i < n; ++i) {
            Tensor oi = o.narrow(0, i, 1);
            be.gemm(probabilities(be, q, k, i, 1, mask), false, v.narrow(0, i, 1), false, oi);
        }
        report_ring_step(ctx, Phase::forward, s, o, h, out);
    }
}

void Attention::probe_ring_backward(RunContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& d_o, HeadCounts h, const Layout& out) const {
    Backend& be = *ctx.backend;
    const ContextShard& ring = *ctx.ring_probe;
    const std::vector<int> owner = owners(ring);
    const int64_t n = h.b * h.heads, t = q.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
    std::vector<Tensor> ds;  // each head's whole dS [1, t, t]
    for (int64_t i = 0; i < n; ++i) {
        const Tensor p = probabilities(be, q, k, i, 1, Tensor());
        Tensor dp = empty_like(p), dsi = empty_like(p);
        be.gemm(d_o.narrow(0, i, 1), false, v.narrow(0, i, 1), true, dp);
        be.softmax_backward(p, dp, dsi);
        ds.push_back(dsi);
    }
    for (int s = 0; s < ring.parts; ++s) {
        const Tensor seen = visible_mask(
            t, t, q, [&](int64_t i, int64_t j) { return seen_by(owner, ring.parts, causal_, s, i, j); }, 1.0,
            0.0);
        Tensor dq(q.shape(), q.dtype(), q.device());
        for (int64_t i = 0; i < n; ++i) {
            Tensor part = empty_like(ds[static_cast<size_t>(i)]), dqi = dq.narrow(0, i, 1);
            be.mul(ds[static_cast<size_t>(i)], seen, part);
            be.gemm(part, false, k.narrow(0, i, 1), false, dqi, scale);
        }
        report_ring_step(ctx, Phase::backward, s, dq, h, out);
    }
}

}  // namespace ptool
