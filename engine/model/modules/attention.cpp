// Multi-head (and grouped-query) self-attention with explicit backward.
//   q = q_proj(x) -> [B, H, T, hd]     k, v = k_proj(x), v_proj(x) -> [B, KV, T, hd], expanded to H heads
//   s = q @ k^T / sqrt(hd)  [B*H, T, T];  p = softmax(s) (causal: key j <= query i)
//   o = p @ v  [B*H, T, hd] -> [B, T, dim];  y = o_proj(o)
// backward: dp = do @ v^T, dv = p^T @ do, ds = softmax'(p, dp) / sqrt(hd), dq = ds @ k, dk = ds^T @ q.
#include <cmath>
#include <limits>
#include <optional>

#include "backend/meta/meta_backend.h"
#include "comm/comm_stats.h"
#include "comm/communicator.h"
#include "comm/dim_collectives.h"
#include "core/framework_memory.h"
#include "core/tensor_ops.h"
#include "model/blocks.h"
#include "model/context_shard.h"
#include "model/layers.h"
#include "model/module_type.h"
#include "model/modules/attention_heads.h"

namespace ptool {
namespace {

// attention: dim, heads, kv_heads (= heads), causal (false), bias (true: sets both of) qkv_bias and
// o_bias, attn_implementation (eager | flash), rope_theta, rope_scaling (docs/model_format.md).
class AttentionType final : public ModuleType {
public:
    AttentionType() : ModuleType("attention", 130) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        YamlMap& m = e.keys;
        Attention::Options o;
        o.heads = e.positive("heads");
        o.dim = e.positive("dim");
        o.kv_heads = m.has("kv_heads") ? e.positive("kv_heads") : o.heads;
        o.head_dim = m.has("head_dim") ? e.positive("head_dim") : 0;
        if (auto qk = m.get("qk_norm")) {  // true: per head (Qwen3); full: over all heads' features (OLMo2)
            const std::string v = qk->as_string("'qk_norm'");
            if (v != "true" && v != "false" && v != "full")
                qk->fail(
                    fmt::format("qk_norm '{}': valid: true (per head), false, full (all heads at once)", v));
            o.qk_norm = v != "false", o.qk_norm_full = v == "full";
        }
        o.qk_norm_eps = m.double_or("qk_norm_eps", o.qk_norm_eps);
        if (!(o.qk_norm_eps > 0) || !std::isfinite(o.qk_norm_eps))
            m.at("qk_norm_eps").fail("qk_norm_eps must be a finite number > 0");
        o.causal = m.bool_or("causal", false);
        const bool bias = m.bool_or("bias", true);  // bias sets both; qkv_bias and o_bias each their own
        o.qkv_bias = m.bool_or("qkv_bias", bias), o.o_bias = m.bool_or("o_bias", bias);
        b.account(m.at("dim"), param_count(m.at("dim"), o));
        if (auto impl = m.get("attn_implementation")) {
            const std::string v = impl->as_string("'attn_implementation'");
            if (v != "eager" && v != "flash")
                impl->fail(fmt::format("attn_implementation '{}': valid: eager, flash", v));
            o.flash = v == "flash";
        }
        if (auto r = m.get("rope_theta")) {
            o.rope_theta = r->as_double("'rope_theta'");
            if (!(*o.rope_theta > 0) || !std::isfinite(*o.rope_theta))
                r->fail(fmt::format("rope_theta must be > 0, got {}", *o.rope_theta));
        }
        if (auto rs = m.get("rope_scaling")) o.rope_scaling = rope_scaling(*rs, o);
        return std::make_shared<Attention>(e.name, e.where, o, b.dtype());
    }
    TpTemplate tp_template() const override {
        return {.rule = TpRule::projections, .colwise = ".[qkv]_proj", .rowwise = ".o_proj"};
    }
    ShrinkKeys shrink_keys() const override {
        return {.sizes = {"dim"}, .heads = "heads", .kv_heads = "kv_heads", .heads_of = "dim"};
    }

private:
    // q_proj [heads x hd, dim], k_proj and v_proj [kv_heads x hd, dim], o_proj [dim, heads x hd],
    // their biases, and qk_norm's two [hd] weights (hd: head_dim, else dim / heads), or under
    // qk_norm: full [heads x hd] and [kv_heads x hd].
    static int64_t param_count(const YamlNode& at, const Attention::Options& o) {
        const int64_t hd =
            o.head_dim ? o.head_dim : o.dim / o.heads;  // not divisible: the constructor says so
        const int64_t q_dim = size_mul(at, o.heads, hd), kv_dim = size_mul(at, o.kv_heads, hd);
        const int64_t q = size_add(at, size_mul(at, q_dim, o.dim), o.qkv_bias ? q_dim : 0);
        const int64_t kv = size_add(at, size_mul(at, kv_dim, o.dim), o.qkv_bias ? kv_dim : 0);
        const int64_t out = size_add(at, size_mul(at, o.dim, q_dim), o.o_bias ? o.dim : 0);
        const int64_t norms = !o.qk_norm ? 0 : o.qk_norm_full ? size_add(at, q_dim, kv_dim) : 2 * hd;
        return size_add(at, size_add(at, size_add(at, q, size_mul(at, 2, kv)), out), norms);
    }

    static RopeScaling rope_scaling(const YamlNode& node, const Attention::Options& o) {
        if (!o.rope_theta) node.fail("rope_scaling needs rope_theta (RoPE)");
        YamlMap sm(node, "'rope_scaling'");
        RopeScaling s;
        YamlNode type = sm.at("type");
        s.type = type.as_string("rope_scaling 'type'");
        if (s.type != "linear" && s.type != "llama3")
            type.fail(
                fmt::format("rope_scaling type '{}'{}", s.type, did_you_mean(s.type, {"linear", "llama3"})));
        auto positive = [&](const char* key, double fallback) {
            const double v = sm.double_or(key, fallback);
            if (!(v > 0) || !std::isfinite(v))
                sm.at(key).fail(fmt::format("rope_scaling {} must be a finite number > 0", key));
            return v;
        };
        s.factor = positive("factor", 1.0);
        if (s.type == "llama3") {
            s.low_freq_factor = positive("low_freq_factor", 1.0);
            s.high_freq_factor = positive("high_freq_factor", 4.0);
            s.original_max_position_embeddings = positive("original_max_position_embeddings", 8192.0);
            if (!(s.high_freq_factor > s.low_freq_factor))
                sm.at("high_freq_factor").fail("rope_scaling high_freq_factor must be above low_freq_factor");
        }
        sm.finish();
        return s;
    }
};
const AttentionType attention_type;
PTOOL_REGISTER_MODULE_TYPE(attention_type);

}  // namespace

Attention::Attention(std::string name, SourceLocation where, const Options& o, DType dtype)
    : Module(attention_type, std::move(name), std::move(where)),
      dim_(o.dim),
      heads_(o.heads),
      kv_heads_(o.kv_heads),
      hd_(o.head_dim ? o.head_dim : o.dim / o.heads),
      causal_(o.causal),
      flash_(o.flash),
      qk_norm_(o.qk_norm),
      qk_norm_full_(o.qk_norm_full) {
    if (!o.head_dim && dim_ % heads_ != 0)
        this->fail(
            fmt::format("attention dim {} is not divisible by heads {} (or give head_dim)", dim_, heads_));
    if (heads_ % kv_heads_ != 0)
        this->fail(fmt::format("attention heads {} is not divisible by kv_heads {}", heads_, kv_heads_));
    const int64_t hd = hd_, q_dim = hd * heads_, kv_dim = hd * kv_heads_;
    if (o.rope_theta) {
        if (hd % 2 != 0) this->fail(fmt::format("rope needs an even head dim, got {}", hd));
        rope_.emplace(*o.rope_theta, hd, o.rope_scaling);
        // every frequency finite in float32 (as transformers keeps inv_freq), and its angle at
        // every position float32 counts exactly (below 2^24): a base far under 1 (or a tiny linear
        // factor) overflows them, and the run would be NaN from the first forward. (A huge base's
        // frequencies underflow to 0: angles of 0, finite, as transformers computes them.)
        for (int64_t i = 0; i < hd / 2; ++i)
            if (const float f = rope_->inv_freq(i); !(f <= std::numeric_limits<float>::max() / 0x1p24f))
                this->fail(
                    fmt::format("rope_theta {} gives a rotary frequency of {} (float32, index {} of {}): "
                                "its angles overflow; RoPE's base is normally 10000 or more",
                                *o.rope_theta, f, i, hd / 2));
    }
    add_child("q_proj", std::make_shared<Linear>("q_proj", this->where(), dim_, q_dim, o.qkv_bias, dtype));
    add_child("k_proj", std::make_shared<Linear>("k_proj", this->where(), dim_, kv_dim, o.qkv_bias, dtype));
    add_child("v_proj", std::make_shared<Linear>("v_proj", this->where(), dim_, kv_dim, o.qkv_bias, dtype));
    add_child("o_proj", std::make_shared<Linear>("o_proj", this->where(), q_dim, dim_, o.o_bias, dtype));
    if (qk_norm_)
        for (const char* name : {"q_norm", "k_norm"}) {
            const int64_t width = !qk_norm_full_ ? hd : name[0] == 'q' ? q_dim : kv_dim;
            add_child(name, std::make_shared<Norm>(*find_module_type("rms_norm"), name, this->where(), width,
                                                   o.qk_norm_eps, true, false, true, dtype));
        }
}

Placed Attention::head_norm(RunContext& ctx, int which, const Placed& x, Phase phase) const {
    if (!qk_norm_) return x;
    Module& norm = *children()[static_cast<size_t>(4 + which)].second;
    if (qk_norm_full_) return phase == Phase::forward ? norm.forward(ctx, x) : norm.backward(ctx, x);
    const Shape& s = x.t.shape();
    const Placed heads{x.t.reshape({s[0], s[1], s[2] / hd_, hd_}),
                       x.p.normalized(3),
                       {x.global[0], x.global[1], x.global[2] / hd_, hd_}};
    const Placed y = phase == Phase::forward ? norm.forward(ctx, heads) : norm.backward(ctx, heads);
    return {y.t.reshape(s), x.p, x.global};
}

Shape Attention::output_shape(const Shape& in) const {
    if (in.size() != 3 || in[2] != dim_)
        fail(fmt::format("attention '{}' expects [batch, seq, {}], got {}", fqn(), dim_, shape_str(in)));
    return in;
}

namespace attention_heads {

// [B, T, n*hd] -> [B*n, T, hd]
Tensor split_heads(Backend& be, const Tensor& x, int64_t n) {
    const int64_t b = x.size(0), t = x.size(1), hd = x.size(2) / n;
    Tensor y = Tensor::empty({b, n, t, hd}, x.dtype(), x.device());
    be.transpose12(x.reshape({b, t, n, hd}), y);
    return y.reshape({b * n, t, hd});
}

// [B*n, T, hd] -> [B, T, n*hd] (n given: B may be 0 on a rank whose batch shard is empty)
Tensor merge_heads(Backend& be, const Tensor& x, int64_t b, int64_t n) {
    const int64_t t = x.size(1), hd = x.size(2);
    Tensor y = Tensor::empty({b, t, n, hd}, x.dtype(), x.device());
    be.transpose12(x.reshape({b, n, t, hd}), y);
    return y.reshape({b, t, n * hd});
}

// [B*KV, T, hd] -> [B*H, T, hd]: query head h reads kv head h / group. (each_head: on meta one
// head's copy, counted for all; every head's slice has the same shape)
Tensor expand_kv(Backend& be, const Tensor& kv, int64_t b, int64_t heads, int64_t kv_heads) {
    if (heads == kv_heads) return kv;
    const int64_t group = heads / kv_heads;
    Tensor out({b * heads, kv.size(1), kv.size(2)}, kv.dtype(), kv.device());
    each_head(b * heads, kv, [&](int64_t i) {
        Tensor dst = out.narrow(0, i, 1);
        be.copy(kv.narrow(0, (i / heads) * kv_heads + (i % heads) / group, 1), dst);
    });
    return out;
}

// The adjoint of expand_kv: sums the gradients of the query heads that share a kv head (in head
// order; on meta one head's sum, counted for all).
Tensor reduce_kv(Backend& be, const Tensor& d, int64_t b, int64_t heads, int64_t kv_heads) {
    if (heads == kv_heads) return d;
    const int64_t group = heads / kv_heads;
    Tensor out({b * kv_heads, d.size(1), d.size(2)}, d.dtype(), d.device());
    each_head(b * heads, d, [&](int64_t i) {
        Tensor dst = out.narrow(0, (i / heads) * kv_heads + (i % heads) / group, 1);
        be.axpy(1.0, d.narrow(0, i, 1), dst);
    });
    return out;
}

// How explain counts a flash head (meta's MetaKernelMode): one fused kernel whose softmax stays on
// chip, computing of its T x T products the (T + 1) / 2T on and below the diagonal when causal
MetaKernelMode flash_kernel(bool causal, const Tensor& q, int64_t t, bool backward) {
    return {.gemm_share = causal && t > 0 ? static_cast<double>(t + 1) / static_cast<double>(2 * t) : 1,
            .on_chip = true,
            .attention = true,
            .attention_key = {backward, q.dtype(), causal, q.size(1), t, q.size(2)}};
}

// body(i) for each of n head slices; on meta tensors one slice, its work counted n times (each
// slice allocates and frees alike, and meta computes nothing: the same peak and work, 1/n the time)
void each_head(int64_t n, const Tensor& like, const std::function<void(int64_t)>& body) {
    if (like.device() == Device::meta) return meta_repeat(n, [&] { body(0); });
    for (int64_t i = 0; i < n; ++i) body(i);
}

// A flash head's query rows in tiles of kFlashRows, as FlashAttention's kernels hold blocks of rows
// on chip: only a tile's scores [rows, keys] live at once, so a long sequence's memory is linear
// in it. body(r0, rows) per tile; a head of kFlashRows rows or fewer is one tile (its numbers as
// ever); on meta tensors one full tile counted for them all, then the short last one.
constexpr int64_t kFlashRows = 128;
void each_row_tile(int64_t t, const Tensor& like, const std::function<void(int64_t, int64_t)>& body) {
    if (t <= kFlashRows) {
        if (t > 0) body(0, t);
        return;
    }
    const int64_t full = t / kFlashRows, rest = t % kFlashRows;
    if (like.device() == Device::meta) {
        meta_repeat(full, [&] { body(0, kFlashRows); });
        if (rest) body(full * kFlashRows, rest);
        return;
    }
    for (int64_t r0 = 0; r0 < t; r0 += kFlashRows) body(r0, std::min(kFlashRows, t - r0));
}

// Rows [r0, r0 + n) of head i of x [heads, T, hd]: a view [1, n, hd].
Tensor head_rows(const Tensor& x, int64_t i, int64_t r0, int64_t n) {
    return x.narrow(0, i, 1).reshape({x.size(1), x.size(2)}).narrow(0, r0, n).reshape({1, n, x.size(2)});
}

// Context parallelism (model/context_shard.h), allgather rotation: every rank's keys or values
// [N, t, hd] gathered along the sequence into position order [N, T, hd] ...
static Tensor gather_sequence(const ContextShard& cp, const Tensor& x) {
    const Shape whole{x.size(0), cp.seq, x.size(2)};
    return cp.natural(all_gather_dim(x, 1, whole, *cp.comm), 1);
}

// ... and its adjoint: each rank's gradients of the whole sequence's keys or values summed, this
// rank's positions kept (a reduce_scatter along the sequence).
static Tensor scatter_sequence(const ContextShard& cp, const Tensor& dx) {
    return reduce_scatter_dim(cp.cp_ordered(dx, 1), 1, *cp.comm);
}

// A mask [1, rows, keys] on like's device: `seen` where visible(i, j) (query row i, key j), `unseen`
// elsewhere (an additive mask: 0 and -inf).
Tensor visible_mask(int64_t rows, int64_t keys, const Tensor& like,
                    const std::function<bool(int64_t, int64_t)>& visible, double seen, double unseen) {
    if (like.device() == Device::meta) return Tensor::empty({1, rows, keys}, like.dtype(), Device::meta);
    Tensor m = Tensor::empty({1, rows, keys}, like.dtype());
    dispatch_float(like.dtype(),
                   [&](auto tag) {  // the values Tensor::set writes, without its per-element cost
                       using T = decltype(tag);
                       const T on = T(static_cast<acc_t<T>>(seen)), off = T(static_cast<acc_t<T>>(unseen));
                       T* p = m.data<T>();
                       for (int64_t i = 0; i < rows; ++i)
                           for (int64_t j = 0; j < keys; ++j) p[i * keys + j] = visible(i, j) ? on : off;
                   });
    return like.device() == Device::cpu ? m : m.to_device(like.device());
}

// The causal mask of query rows [r0, r0 + rows) against `keys` keys in position order: [1, rows,
// keys], 0 where key j <= the query's position (its row, or a cp rank's position of it), -inf
// above. A whole head of a whole sequence needs none (the softmax's own causal flag, bitwise as before).

Tensor causal_mask(const ContextShard* cp, int64_t r0, int64_t rows, int64_t keys, const Tensor& like) {
    return visible_mask(
        rows, keys, like,
        [&](int64_t i, int64_t j) { return j <= (cp ? cp->positions[static_cast<size_t>(r0 + i)] : r0 + i); },
        0.0, -INFINITY);
}

Tensor position_mask(const std::vector<int64_t>& queries, int64_t r0, int64_t rows,
                     const std::vector<int64_t>& keys, const Tensor& like) {
    return visible_mask(
        rows, static_cast<int64_t>(keys.size()), like,
        [&](int64_t i, int64_t j) {
            return keys[static_cast<size_t>(j)] <= queries[static_cast<size_t>(r0 + i)];
        },
        0.0, -INFINITY);
}

}  // namespace attention_heads

using namespace attention_heads;

Layout Attention::layout(LayoutVisitor& v, const Layout& in) const {
    const Layout q = v.call(proj(0), in), k = v.call(proj(1), in), val = v.call(proj(2), in);
    if (!q.p.same_as(k.p, 3) || !q.p.same_as(val.p, 3))
        conflict(fmt::format(
            "attention '{}' gets q, k and v with different placements ({}, {}, {}): lay out q_proj, "
            "k_proj and v_proj alike",
            fqn(), q.p.str(), k.p.str(), val.p.str()));
    const Placement p = q.p.normalized(3);
    if (p.is_partial())
        conflict(
            fmt::format("attention '{}' gets partial sums from its projections: reduce them first", fqn()));
    if (p.is_shard() && p.dim == 1)
        conflict(fmt::format(
            "attention '{}' needs the whole sequence in q, k and v but gets it Shard(1): gather the "
            "sequence in the projections (input_layouts shard(1) on q/k/v, as Megatron-SP), or "
            "prepare_input shard(1) -> replicate on '{}'",
            fqn(), fqn()));
    if (p.is_shard() && p.dim == 2) {  // heads split over ranks: whole heads, and the kv groups with them
        const int64_t hd = hd_, n = v.parts();
        for (int r = 0; r < n; ++r) {
            const int64_t qh = chunk_of(q.global[2], static_cast<int>(n), r).length,
                          kh = chunk_of(k.global[2], static_cast<int>(n), r).length;
            if (qh % hd != 0 || kh % hd != 0 || qh / hd != kh / hd * (heads_ / kv_heads_))
                conflict(fmt::format(
                    "attention '{}' splits its heads over {} ranks: its {} query heads and {} kv heads "
                    "must each divide evenly",
                    fqn(), n, heads_, kv_heads_));
        }
    }
    if (qk_norm_) {
        if (p.is_shard() && p.dim == 2)
            conflict(fmt::format(
                "attention '{}' normalises q and k (qk_norm) with its heads split over ranks: the norms' "
                "weight gradients (and under qk_norm: full the norms themselves) would be partial over tp; "
                "not modelled yet",
                fqn()));
        for (int i = 0; i < 2; ++i) {
            const Layout& x = i == 0 ? q : k;
            v.call(*children()[static_cast<size_t>(4 + i)].second,
                   qk_norm_full_ ? Layout{x.global, p}
                                 : Layout{{x.global[0], x.global[1], x.global[2] / hd_, hd_}, p});
        }
    }
    return v.call(proj(3), Layout{{q.global[0], q.global[1], q.global[2]}, q.p});
}

Tensor Attention::probabilities(Backend& be, const Tensor& q, const Tensor& k, int64_t i, int64_t n,
                                const Tensor& mask) const {
    const int64_t t = q.size(1), keys = k.size(1), hd = q.size(2);
    Tensor s = Tensor::empty({n, t, keys}, q.dtype(), q.device());
    be.gemm(q.narrow(0, i, n), false, k.narrow(0, i, n), true, s, 1.0 / std::sqrt(static_cast<double>(hd)));
    if (mask.defined())  // a context-parallel rank's queries: masked by position
        for (int64_t h = 0; h < n; ++h) {
            Tensor sh = s.narrow(0, h, 1);
            be.add(sh, mask, sh);
        }
    Tensor p = empty_like(s);
    be.softmax(s, causal_ && !mask.defined(), p);
    return p;
}

Tensor Attention::tile_probabilities(Backend& be, const Tensor& q, const Tensor& k, int64_t i, int64_t r0,
                                     int64_t rows, const ContextShard* cp) const {
    const int64_t t = q.size(1), keys = k.size(1), hd = q.size(2);
    if (r0 == 0 && rows == t && !cp) return probabilities(be, q, k, i, 1, Tensor());
    Tensor s = Tensor::empty({1, rows, keys}, q.dtype(), q.device());
    be.gemm(head_rows(q, i, r0, rows), false, k.narrow(0, i, 1), true, s,
            1.0 / std::sqrt(static_cast<double>(hd)));
    if (causal_) {
        const Tensor mask = causal_mask(cp, r0, rows, keys, s);
        be.add(s, mask, s);
    }
    Tensor p = empty_like(s);
    be.softmax(s, false, p);
    return p;
}

Placed Attention::forward_placed(RunContext& ctx, const Placed& x) {
    Backend& be = *ctx.backend;
    const int64_t hd = hd_;
    // Under tensor parallelism q/k/v are colwise: this rank holds heads/tp query heads and
    // kv_heads/tp kv heads; heads are independent, so the same code runs on the local ones. The
    // batch and sequence come from the projections (Megatron-SP gathers the sequence in them).
    // qk_norm: each head of q and k RMS-normalised (Qwen3), before RoPE.
    const Placed q_flat = head_norm(ctx, 0, proj(0).forward(ctx, x), Phase::forward),
                 k_flat = head_norm(ctx, 1, proj(1).forward(ctx, x), Phase::forward),
                 v_flat = proj(2).forward(ctx, x);
    const int64_t b = q_flat.t.size(0), t = q_flat.t.size(1);
    const int64_t heads = q_flat.t.size(-1) / hd, kv_heads = k_flat.t.size(-1) / hd;
    PTOOL_REQUIRE(heads * hd == q_flat.t.size(-1) && kv_heads * hd == k_flat.t.size(-1),
                  "attention '{}': partial heads", fqn());
    Tensor q = split_heads(be, q_flat.t, heads);  // [B*H, T, hd]
    Tensor k_heads = split_heads(be, k_flat.t, kv_heads), v_heads = split_heads(be, v_flat.t, kv_heads);
    // under context parallelism this rank holds some positions of the sequence (q, and the keys
    // and values it contributes); attention needs every key and value (allgather rotation)
    const ContextShard* cp = ctx.context && ctx.context->parts > 1 ? ctx.context : nullptr;
    const std::vector<int64_t>* positions = ctx.context ? &ctx.context->positions : nullptr;
    if (rope_)
        q = rope_->forward(be, q, positions),
        k_heads = rope_->forward(be, k_heads, positions);  // before the kv heads are shared, as HF
    const Tensor heads_kept = Tensor::scalar(static_cast<double>(heads), DType::float64),
                 kv_heads_kept = Tensor::scalar(static_cast<double>(kv_heads), DType::float64);
    // SDPA's flash kernel (and the ring's, which is one) is one op the op-level selective policy
    // keeps; eager attention's bmm and softmax are not kept (model/selective_recompute.h)
    const bool ring = cp && cp->ring();
    const KeptOutput kept = flash_ || ring ? kept_output(ctx, SelectiveOp::attention) : KeptOutput::none;
    const Shape o_global{q_flat.global[0], q_flat.global[1], q_flat.global[2]};
    if (ring) {  // keys and values come round the ring (attention_ring.cpp): nothing gathered
        Tensor o, m, l;
        if (kept == KeptOutput::take) {
            o = kept_.take(ctx), m = kept_.take(ctx), l = kept_.take(ctx);
        } else {
            o = ring_forward(ctx, q, k_heads, v_heads, {b, heads, kv_heads}, {o_global, q_flat.p}, m, l);
            if (kept == KeptOutput::keep) kept_.keep(ctx, o), kept_.keep(ctx, m), kept_.keep(ctx, l);
        }
        save({q, k_heads, v_heads, o, heads_kept, kv_heads_kept, m, l});
        return proj(3).forward(ctx, {merge_heads(be, o, b, heads), q_flat.p, o_global});
    }
    if (cp) {
        CommScope scope(cp->comm->counter().get(), fqn(), {CommSiteKind::context_kv});
        k_heads = gather_sequence(*cp, k_heads), v_heads = gather_sequence(*cp, v_heads);
    }
    if (flash_ && fused(be, ctx, q))  // one kernel over every head and row (attention_fused.cpp)
        return fused_forward(ctx, q_flat, q, k_heads, v_heads, {b, heads, kv_heads}, cp, kept);
    const Tensor mask = cp && causal_ && !flash_ ? causal_mask(cp, 0, t, cp->seq, q) : Tensor();
    // SDPA's flash kernel shares each kv head among its query heads (enable_gqa, as transformers
    // calls it): the kv heads expanded are ptool's stand-in, and PyTorch keeps k and v unexpanded
    // and the kernel's logsumexp [B*H, T] in float32 for its backward
    const bool native_gqa = flash_ && heads != kv_heads;
    Tensor k, v;
    {
        std::optional<TorchAllocScope> own;
        std::optional<MetaKernelScope> in_kernel;
        if (native_gqa)
            own.emplace(TorchAlloc::ptool_only), in_kernel.emplace(MetaKernelMode{.on_chip = true});
        k = expand_kv(be, k_heads, b, heads, kv_heads), v = expand_kv(be, v_heads, b, heads, kv_heads);
    }
    const Tensor lse = flash_ ? torch_only({b * heads, t}, DType::float32, MemoryUse::activations) : Tensor();
    const Tensor k_kept = native_gqa ? torch_only(k_heads.shape(), k_heads.dtype(), MemoryUse::activations)
                                     : Tensor(),
                 v_kept = native_gqa ? torch_only(v_heads.shape(), v_heads.dtype(), MemoryUse::activations)
                                     : Tensor();
    Tensor o;
    if (kept == KeptOutput::take) {
        o = kept_.take(ctx);
        save({q, k, v, Tensor(), heads_kept, kv_heads_kept, lse, k_kept, v_kept});
    } else if (!flash_) {
        o = Tensor::empty({b * heads, t, hd}, q.dtype(), q.device());
        const Tensor p = probabilities(be, q, k, 0, b * heads, mask);
        be.gemm(p, false, v, false, o);
        // recompute_core (Megatron's selective recompute): the probabilities are recomputed in backward
        save({q, k, v, recompute_core_ ? Tensor() : p, heads_kept, kv_heads_kept});
    } else {  // one head, one tile of its query rows at a time: no [B*H, T, T] tensor lives
        o = Tensor::empty({b * heads, t, hd}, q.dtype(), q.device());
        MetaKernelScope kernel(flash_kernel(causal_, q, k.size(1), false));
        TorchAllocScope on_chip(
            TorchAlloc::ptool_only);  // a tile's scores live in the kernel's shared memory
        each_head(b * heads, o, [&](int64_t i) {
            each_row_tile(t, o, [&](int64_t r0, int64_t rows) {
                Tensor oi = head_rows(o, i, r0, rows);
                be.gemm(tile_probabilities(be, q, k, i, r0, rows, cp), false, v.narrow(0, i, 1), false, oi);
            });
        });
        save({q, k, v, Tensor(), heads_kept, kv_heads_kept, lse, k_kept, v_kept});
        if (kept == KeptOutput::keep) kept_.keep(ctx, o);
    }
    if (ctx.observer && ctx.ring_probe && !cp)  // the reference beside a ring plan: its steps' outputs
        probe_ring_forward(ctx, q, k, v, {b, heads, kv_heads}, {o_global, q_flat.p});
    return proj(3).forward(ctx, {merge_heads(be, o, b, heads), q_flat.p, o_global});
}

Placed Attention::backward_placed(RunContext& ctx, const Placed& dy, const Layout&) {
    Backend& be = *ctx.backend;
    std::vector<Tensor> sv = restore();
    const Tensor &q = sv[0], &k = sv[1], &v = sv[2], &p = sv[3];
    const int64_t hd = hd_;
    const int64_t heads = static_cast<int64_t>(sv[4].item()), kv_heads = static_cast<int64_t>(sv[5].item());
    const Placed d_out = proj(3).backward(ctx, dy);  // [B, T, H*hd] as q/k/v's gradients are placed
    const int64_t b = d_out.t.size(0);
    const ContextShard* cp = ctx.context && ctx.context->parts > 1 ? ctx.context : nullptr;
    if (sv.size() == 8 && !(cp && cp->ring())) {  // the fused kernel's forward (attention_fused.cpp)
        Tensor dq, dk_heads, dv_heads;
        fused_backward(be, sv, d_out.t, {b, heads, kv_heads}, cp, dq, dk_heads, dv_heads);
        if (cp) {
            CommScope scope(cp->comm->counter().get(), fqn(), {CommSiteKind::context_kv});
            dv_heads = scatter_sequence(*cp, dv_heads), dk_heads = scatter_sequence(*cp, dk_heads);
        }
        return project_backward(ctx, d_out, dq, dk_heads, dv_heads, {b, heads, kv_heads});
    }
    Tensor d_o = split_heads(be, d_out.t, heads);  // [B*H, T, hd]
    if (cp && cp->ring()) {                        // (attention_ring.cpp) then the projections, as below
        Tensor dq, dk_heads, dv_heads;
        ring_backward(ctx, sv, d_o, {b, heads, kv_heads}, d_out.layout(), dq, dk_heads, dv_heads);
        report_ring_kv_grads(ctx, dk_heads, dv_heads, {b, heads, kv_heads}, d_out.layout());
        return project_backward(ctx, d_out, dq, dk_heads, dv_heads, {b, heads, kv_heads});
    }
    if (ctx.observer && ctx.ring_probe && !cp)  // the reference beside a ring plan: its steps' dq
        probe_ring_backward(ctx, q, k, v, d_o, {b, heads, kv_heads}, d_out.layout());
    Tensor dv = empty_like(v), dq = empty_like(q), dk = empty_like(k);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    // one slice of heads: n heads from row r0 on; dv and dk sum over the query rows, tile by tile
    auto slice_backward = [&](const Tensor& pi, int64_t i, int64_t n, int64_t r0, int64_t rows) {
        const bool whole = rows == q.size(1);
        const Tensor d_oi = whole ? d_o.narrow(0, i, n) : head_rows(d_o, i, r0, rows),
                     qi = whole ? q.narrow(0, i, n) : head_rows(q, i, r0, rows), vi = v.narrow(0, i, n),
                     ki = k.narrow(0, i, n);
        Tensor dp = empty_like(pi), ds = empty_like(pi), dvi = dv.narrow(0, i, n), dki = dk.narrow(0, i, n),
               dqi = whole ? dq.narrow(0, i, n) : head_rows(dq, i, r0, rows);
        const double accumulate = r0 > 0 ? 1.0 : 0.0;
        be.gemm(d_oi, false, vi, true, dp);
        be.gemm(pi, true, d_oi, false, dvi, 1.0, accumulate);
        be.softmax_backward(pi, dp, ds);
        be.gemm(ds, false, ki, false, dqi, scale);
        be.gemm(ds, true, qi, false, dki, scale, accumulate);
    };
    if (!flash_) {  // every head at once from the kept probabilities (recomputed at once under
                    // recompute_core)
        const int64_t t = q.size(1);
        Tensor pi = p;
        if (!p.defined() &&
            b * heads > 0) {  // recomputed: meta counts its FLOPs as recompute, not the model's
            const bool was = meta_work().recomputing;
            meta_work().recomputing = true;
            pi = probabilities(be, q, k, 0, b * heads,
                               cp && causal_ ? causal_mask(cp, 0, t, cp->seq, q) : Tensor());
            meta_work().recomputing = was;
        }
        if (b * heads > 0) slice_backward(pi, 0, b * heads, 0, t);
    } else {  // each head's tiles recomputed (the projections' backward after them is not the kernel's)
        MetaKernelScope kernel(flash_kernel(causal_, q, k.size(1), true));
        TorchAllocScope on_chip(TorchAlloc::ptool_only);
        each_head(b * heads, q, [&](int64_t i) {
            each_row_tile(q.size(1), q, [&](int64_t r0, int64_t rows) {
                const bool was = meta_work().recomputing;
                meta_work().recomputing = true;
                const Tensor pi = tile_probabilities(be, q, k, i, r0, rows, cp);
                meta_work().recomputing = was;
                slice_backward(pi, i, 1, r0, rows);
            });
        });
    }
    Tensor dv_heads, dk_heads;
    {  // inside SDPA's kernel when it shares kv heads natively (ptool's stand-in, as the forward's expansion)
        std::optional<MetaKernelScope> in_kernel;
        if (flash_ && heads != kv_heads) in_kernel.emplace(MetaKernelMode{.on_chip = true});
        dv_heads = reduce_kv(be, dv, b, heads, kv_heads), dk_heads = reduce_kv(be, dk, b, heads, kv_heads);
    }
    if (ctx.observer && ctx.ring_probe && !cp)
        report_ring_kv_grads(ctx, dk_heads, dv_heads, {b, heads, kv_heads}, d_out.layout());
    if (cp) {  // every rank's queries' gradients of this rank's keys and values
        CommScope scope(cp->comm->counter().get(), fqn(), {CommSiteKind::context_kv});
        dv_heads = scatter_sequence(*cp, dv_heads), dk_heads = scatter_sequence(*cp, dk_heads);
    }
    return project_backward(ctx, d_out, dq, dk_heads, dv_heads, {b, heads, kv_heads});
}

// Backward through RoPE and the projections, in reverse order of their forward calls (tensors a
// module returned are never written in place: observers may hold them).
Placed Attention::project_backward(RunContext& ctx, const Placed& d_out, Tensor dq, Tensor dk_heads,
                                   const Tensor& dv_heads, HeadCounts h) {
    Backend& be = *ctx.backend;
    const int64_t b = h.b, heads = h.heads, kv_heads = h.kv_heads;
    const std::vector<int64_t>* positions = ctx.context ? &ctx.context->positions : nullptr;
    const Placement& p = d_out.p;
    const Shape q_global = d_out.global, kv_global = {q_global[0], q_global[1], hd_ * kv_heads_};
    const Placed dx_v = proj(2).backward(ctx, {merge_heads(be, dv_heads, b, kv_heads), p, kv_global});
    if (rope_) dq = rope_->backward(be, dq, positions), dk_heads = rope_->backward(be, dk_heads, positions);
    const Placed dx_k = proj(1).backward(
        ctx, head_norm(ctx, 1, {merge_heads(be, dk_heads, b, kv_heads), p, kv_global}, Phase::backward));
    const Placed dx_q = proj(0).backward(
        ctx, head_norm(ctx, 0, {merge_heads(be, dq, b, heads), p, q_global}, Phase::backward));
    Tensor dx = empty_like(dx_v.t);
    be.add(dx_v.t, dx_k.t, dx);
    be.axpy(1.0, dx_q.t, dx);
    return {dx, dx_v.p, dx_v.global};
}

}  // namespace ptool
