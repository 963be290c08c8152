// Composite modules: attention (q/k/v/o projections), gated_mlp (Llama's MLP) and the
// containers sequential, repeat (nn.ModuleList of sequentials) and residual. `shared` needs no
// class: the builder registers the same module object under a second name, as PyTorch does.
#pragma once

#include <optional>

#include "model/attention_core.h"
#include "model/context_shard.h"
#include "model/layers.h"
#include "model/rope.h"

namespace ptool {

// Multi-head self-attention on x: [B, T, dim]; heads of size dim/heads; kv_heads < heads is
// grouped-query attention (each kv head serves heads/kv_heads query heads). softmax(q k^T / sqrt(hd)).
// q/k/v and o_proj have biases as qkv_bias and o_bias say (Qwen2: q/k/v only); rope, when set,
// rotates q and k (model/rope.h).
class Attention : public Module, public AttentionCore {
public:
    struct Options {
        int64_t dim = 0, heads = 1, kv_heads = 1;
        int64_t head_dim = 0;  // 0: dim / heads; else q_proj is dim -> heads x head_dim (Qwen3, Gemma)
        bool causal = false, qkv_bias = true, o_bias = true;
        // Qwen3's q/k norm, per head: RMSNorm over each head's head_dim of q and k after the
        // projections, before RoPE (children q_norm, k_norm, weight [head_dim]); qk_norm_eps its eps.
        // qk_norm_full (`qk_norm: full`, OLMo2's): over all of q's (and k's) features at once
        // (weights [heads x head_dim], [kv_heads x head_dim])
        bool qk_norm = false, qk_norm_full = false;
        double qk_norm_eps = 1e-6;
        std::optional<double> rope_theta;
        RopeScaling rope_scaling;  // with rope_theta: HF's rope_scaling (linear, llama3)
        // attn_implementation: eager keeps the softmax probabilities [B*H, T, T] for backward (HF's
        // "eager"); flash keeps q, k, v and recomputes scores and probabilities in backward, one head
        // at a time, as FlashAttention and SDPA's flash kernel do: the same values, no T^2 tensor kept.
        bool flash = false;
    };
    Attention(std::string name, SourceLocation where, const Options& o, DType dtype);
    Shape output_shape(const Shape& in) const override;
    // q, k and v must have one placement: Replicate, Shard(0) (batch) or Shard(-1) (whole heads per
    // rank); the sequence (from the projections, so Megatron-SP gathers it in q/k/v) must be whole.
    Layout layout(LayoutVisitor& v, const Layout& in) const override;
    int64_t heads() const { return heads_; }
    int64_t head_dim() const { return hd_; }
    int64_t kv_heads() const { return kv_heads_; }
    bool flash() const override { return flash_; }
    bool causal() const override { return causal_; }
    // The mask, switched for a call (fault injection's cp_balance_noncausal: a non-causal attention
    // masked as a causal one).
    void set_causal(bool on) override { causal_ = on; }
    // Megatron's selective recompute (--recompute-granularity selective, core_attn): eager attention
    // keeps q, k and v but not the probabilities, and recomputes them in backward (as flash does).
    void set_recompute_core(bool on) override { recompute_core_ = on; }
    KeptOutputs* kept_outputs() override { return &kept_; }
    AttentionCore* attention_core() override { return this; }

protected:
    Placed forward_placed(RunContext& ctx, const Placed& x) override;
    Placed backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) override;

private:
    Linear& proj(int i) const { return static_cast<Linear&>(*children()[i].second); }
    // q_norm (0) or k_norm (1) of qk_norm on x [B, t, n x hd] placed as the projection's output
    // (forward), or on its gradient (backward): each head's hd features, x seen as [B, t, n, hd].
    Placed head_norm(RunContext& ctx, int which, const Placed& x, Phase phase) const;
    // One head slice [i, i+n) of the batched heads: scores and probabilities; `mask` (defined under
    // context parallelism) is added to each head's scores in place of the causal flag.
    Tensor probabilities(Backend& be, const Tensor& q, const Tensor& k, int64_t i, int64_t n,
                         const Tensor& mask) const;
    // Head i's probabilities for its query rows [r0, r0 + rows): [1, rows, keys]; the whole head of
    // a whole sequence is probabilities(i, 1) (bitwise as ever), a tile or a cp rank's rows are
    // masked by position (a flash kernel's tile, model/modules/attention.cpp).
    Tensor tile_probabilities(Backend& be, const Tensor& q, const Tensor& k, int64_t i, int64_t r0,
                              int64_t rows, const ContextShard* cp) const;
    struct HeadCounts {  // this rank's batch rows, query heads and kv heads
        int64_t b, heads, kv_heads;
    };
    // Context parallelism's ring (rotate_method alltoall, model/modules/attention_ring.cpp): this
    // rank's queries q [B*H, t, hd] against every rank's keys and values, which come round the cp
    // ring one block per step and are merged by log-sum-exp; m and l are the rows' softmax
    // statistics, kept for backward.
    Tensor ring_forward(RunContext& ctx, const Tensor& q, const Tensor& k_heads, const Tensor& v_heads,
                        HeadCounts h, const Layout& out, Tensor& m, Tensor& l) const;
    // dq, and this rank's keys' and values' gradients from every rank's queries, returned round the
    // ring; saved: what the forward saved (q, k_heads, v_heads, o, heads, kv heads, m, l).
    void ring_backward(RunContext& ctx, const std::vector<Tensor>& saved, const Tensor& d_o, HeadCounts h,
                       const Layout& out, Tensor& dq, Tensor& dk_heads, Tensor& dv_heads) const;
    // One block through the tile path's ops, merged into the rows' (o, m, l).
    void ring_block_forward(Backend& be, const ContextShard& cp, const Tensor& q, const Tensor& kb,
                            const Tensor& vb, HeadCounts h, const std::vector<int64_t>& keys, Tensor& o,
                            Tensor& m, Tensor& l) const;
    // One block's backward through the tile path's ops: dq added to, the block's dk and dv per kv head.
    void ring_block_backward(Backend& be, const ContextShard& cp, const std::vector<Tensor>& saved,
                             const Tensor& d_o, HeadCounts h, const Tensor& kb, const Tensor& vb,
                             const std::vector<int64_t>& keys, Tensor& dq, Tensor& dk_heads,
                             Tensor& dv_heads) const;
    // What the ring leaves, as events (RunContext::observer): the rows' merged output after step s
    // of the forward, their query gradient after step s of the backward, and the key and value
    // gradients once home; `out` is how the heads' [B, t, H*hd] tensors are placed. The ring reports
    // its own; the reference computes the same from the whole sequence with the plan's cp layout
    // (ctx.ring_probe), masking each query to the keys its rank has seen by step s
    // (model/modules/attention_ring_probe.cpp).
    void report_ring_step(RunContext& ctx, Phase phase, int step, const Tensor& heads, HeadCounts h,
                          const Layout& out) const;
    void report_ring_kv_grads(RunContext& ctx, const Tensor& dk_heads, const Tensor& dv_heads, HeadCounts h,
                              const Layout& out) const;
    void probe_ring_forward(RunContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, HeadCounts h,
                            const Layout& out) const;
    void probe_ring_backward(RunContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& d_o, HeadCounts h, const Layout& out) const;
    // The flash path as one fused kernel where the backend has one (Backend::fused_attention: CUDA;
    // model/modules/attention_fused.cpp): whether this call takes it, the kernel's arguments for
    // queries at `queries` and keys at `keys` (null: in order), its forward (o in merge_heads'
    // layout, with m and l; saved as the ring saves) and backward (dk and dv per kv head).
    bool fused(const Backend& be, const RunContext& ctx, const Tensor& q) const;
    AttentionArgs fused_args(HeadCounts h, const Tensor& like, const std::vector<int64_t>* queries,
                             const std::vector<int64_t>* keys, bool o_merged) const;
    Placed fused_forward(RunContext& ctx, const Placed& q_flat, const Tensor& q, const Tensor& k_heads,
                         const Tensor& v_heads, HeadCounts h, const ContextShard* cp, KeptOutput kept);
    void fused_backward(Backend& be, const std::vector<Tensor>& saved, const Tensor& d_o, HeadCounts h,
                        const ContextShard* cp, Tensor& dq, Tensor& dk_heads, Tensor& dv_heads) const;
    // Backward through RoPE and the q/k/v projections from the heads' gradients.
    Placed project_backward(RunContext& ctx, const Placed& d_out, Tensor dq, Tensor dk_heads,
                            const Tensor& dv_heads, HeadCounts h);
    int64_t dim_, heads_, kv_heads_, hd_;
    bool causal_, flash_, qk_norm_, qk_norm_full_, recompute_core_ = false;
    std::optional<Rope> rope_;
    KeptOutputs kept_;  // the op-level selective policy's kept outputs (model/selective_recompute.h)
};

// y = down_proj(act(gate_proj(x)) * up_proj(x))
class GatedMlp : public Module {
public:
    GatedMlp(std::string name, SourceLocation where, int64_t dim, int64_t hidden, Activation act, bool bias,
             DType dtype);
    Shape output_shape(const Shape& in) const override;
    Layout layout(LayoutVisitor& v, const Layout& in) const override;  // gate and up agree

protected:
    Placed forward_placed(RunContext& ctx, const Placed& x) override;
    Placed backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) override;

private:
    Module& child(int i) const { return *children()[i].second; }
    Activation act_;
};

// Runs its children in order (nn.Sequential; the model's root).
class Sequential : public Module {
public:
    Sequential(std::string name, SourceLocation where);
    Shape output_shape(const Shape& in) const override;
    Layout layout(LayoutVisitor& v, const Layout& in) const override;
    bool takes_ids() const override;
    Chaining chaining() const override { return Chaining::sequence; }

protected:
    Sequential(const ModuleType& type, std::string name, SourceLocation where)  // residual, repeat
        : Module(type, std::move(name), std::move(where)) {}
    Placed forward_placed(RunContext& ctx, const Placed& x) override;
    Placed backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) override;
};

// nn.ModuleList of `count` copies of one block: children "0".."n-1", each a sequential of the
// block's modules (what fully_shard, checkpointing and the planner take block by block).
class Repeat : public Sequential {
public:
    Repeat(std::string name, SourceLocation where);
    Chaining chaining() const override { return Chaining::repeat; }
};

// y = x + body(x), body a sequential of the listed modules.
class Residual : public Sequential {
public:
    Residual(std::string name, SourceLocation where);
    Chaining chaining() const override { return Chaining::residual; }
    Shape output_shape(const Shape& in) const override;
    Layout layout(LayoutVisitor& v, const Layout& in) const override;  // the body keeps the input's layout

protected:
    Placed forward_placed(RunContext& ctx, const Placed& x) override;
    Placed backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) override;
};

}  // namespace ptool
