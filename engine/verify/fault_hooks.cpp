#include "verify/fault_hooks.h"

#include <map>
#include <set>

#include "backend/forwarding_backend.h"
#include "core/tensor_ops.h"
#include "model/attention_core.h"
#include "model/context_shard.h"
#include "model/moe.h"

namespace ptool::faults {
namespace {

// A style's hooks with one of its reductions broken: a partial output or input gradient relabelled
// as if it were reduced (so the style's redistribution skips the collective), or rowwise's bias
// added to every rank's partial sum.
class FaultHooks final : public ModuleHooks {
public:
    FaultHooks(std::shared_ptr<ModuleHooks> inner, FaultKind kind, int parts)
        : inner_(std::move(inner)), kind_(kind), parts_(parts) {}
    Placed pre_forward(RunContext& c, Module& m, const Placed& x) override {
        return inner_->pre_forward(c, m, x);
    }
    Placed post_forward(RunContext& c, Module& m, const Placed& y) override {
        if (!y.p.is_partial()) return inner_->post_forward(c, m, y);
        if (kind_ == FaultKind::skip_all_reduce)
            return inner_->post_forward(c, m, y.relabeled(Placement::replicate()));
        ParamPtr bias = m.param("bias");
        if (kind_ != FaultKind::bias_every_rank || !bias) return inner_->post_forward(c, m, y);
        // every rank adds the bias to its summand; with the one the style adds after the
        // reduction, n biases in all
        Tensor biased = y.t.clone(), b = bias->value.clone();
        c.backend->scale(bias->value, static_cast<double>(parts_ - 1) / parts_, b);
        Tensor rows = biased.reshape({biased.numel() / b.numel(), b.numel()});
        c.backend->add_bias(rows, b);
        return inner_->post_forward(c, m, {biased, y.p, y.global});
    }
    Placed post_forward_backward(RunContext& c, Module& m, const Placed& dy) override {
        return inner_->post_forward_backward(c, m, dy);
    }
    Placed pre_forward_backward(RunContext& c, Module& m, const Placed& dx) override {
        if (kind_ == FaultKind::skip_grad_all_reduce && dx.p.is_partial())
            return inner_->pre_forward_backward(c, m, dx.relabeled(Placement::replicate()));
        return inner_->pre_forward_backward(c, m, dx);
    }
    void post_backward(RunContext& c, Module& m) override { inner_->post_backward(c, m); }
    std::optional<Placement> compute_out(const Module& m) const override { return inner_->compute_out(m); }
    std::optional<Placement> compute_grad_in(const Module& m) const override {
        return inner_->compute_grad_in(m);
    }

private:
    std::shared_ptr<ModuleHooks> inner_;
    FaultKind kind_;
    int parts_;
};

// Faults on modules that have no style: hooks added outside the ones they have.
//   tied_grad          the module's backward leaves its weight's gradient as it found it
//   dropout_same_mask  the mask is drawn as if the activation were whole on every rank
//   recompute_mask     activation checkpointing's recompute draws its mask for another step
class ModuleFaultHooks final : public ModuleHooks {
public:
    explicit ModuleFaultHooks(FaultKind kind) : kind_(kind) {}
    Placed pre_forward(RunContext& c, Module& m, const Placed& x) override {
        if (kind_ == FaultKind::cp_balance_noncausal) causal_mask(c, m, true);
        if (kind_ == FaultKind::recompute_mask && c.recomputing) c.step += 1000003, shifted_ = true;
        if (kind_ != FaultKind::dropout_same_mask) return x;
        layouts_.push(c.microbatch, x.layout());
        if (c.recording) backward_layouts_.push(c.microbatch, x.layout());
        return {x.t, Placement::replicate(), x.t.shape()};
    }
    Placed post_forward(RunContext& c, Module& m, const Placed& y) override {
        if (kind_ == FaultKind::cp_balance_noncausal) causal_mask(c, m, false);
        if (shifted_) c.step -= 1000003, shifted_ = false;
        if (kind_ != FaultKind::dropout_same_mask) return y;
        const Layout l = layouts_.pop(c.microbatch);
        return {y.t, l.p, l.global};
    }
    Placed pre_forward_backward(RunContext& c, Module& m, const Placed& dx) override {
        if (kind_ == FaultKind::cp_balance_noncausal) causal_mask(c, m, false);
        if (kind_ != FaultKind::dropout_same_mask || backward_layouts_.empty(c.microbatch)) return dx;
        const Layout l = backward_layouts_.pop(c.microbatch);  // the input's true layout, for its gradient
        return {dx.t, grad_placement(l.p), l.global};
    }
    Placed post_forward_backward(RunContext& c, Module& m, const Placed& dy) override {
        if (kind_ == FaultKind::cp_balance_noncausal) causal_mask(c, m, true);
        if (kind_ == FaultKind::tied_grad && m.param("weight"))
            kept_.push(c.microbatch, m.param("weight")->grad.clone());
        return dy;
    }
    void post_backward(RunContext& c, Module& m) override {
        if (kind_ != FaultKind::tied_grad || kept_.empty(c.microbatch)) return;
        c.backend->copy(kept_.pop(c.microbatch), m.param("weight")->grad);
    }

    // cp_balance_noncausal: a non-causal attention under load-balanced context parallelism computes
    // with the causal mask for the time of its call (forward and backward)
    void causal_mask(RunContext& c, Module& m, bool on) {
        AttentionCore* a = m.attention_core();
        if (!a || !c.context || c.context->parts == 1 || !c.context->load_balance) return;
        if (on && !a->causal())
            a->set_causal(true), switched_ = true;
        else if (!on && switched_)
            a->set_causal(false), switched_ = false;
    }

private:
    FaultKind kind_;
    MicrobatchStack<Layout> layouts_, backward_layouts_;
    MicrobatchStack<Tensor> kept_;
    bool shifted_ = false;
    bool switched_ = false;  // cp_balance_noncausal: the mask is the fault's for this call
};

// cp_merge_unscaled's backend: the ring's log-sum-exp merge without the max, each block's sum of
// exp(s - its own max) added as if every block's max were the same (a = l, b = l_b).
class UnscaledMergeBackend final : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    void softmax_merge(Tensor& o, Tensor& m, Tensor& l, const Tensor& o_b, const Tensor& m_b,
                       const Tensor& l_b) override {
        Tensor o_true = o.clone(), m_true = m.clone(), l_true = l.clone();
        inner_.softmax_merge(o_true, m_true, l_true, o_b, m_b, l_b);  // the running max it should keep
        Tensor same = empty_like(m);  // every max read as 0: the merge's weights are the raw sums
        inner_.fill(same, 0.0);
        inner_.softmax_merge(o, same, l, o_b, same.clone(), l_b);
        inner_.copy(m_true, m);
    }
};

// The expert-parallel dispatch faults (model/moe_routing.h's ExpertDispatch): the split sizes, the
// permutation, the owner of an expert's rows.
class FaultDispatch final : public ExpertDispatch {
public:
    explicit FaultDispatch(FaultKind k) : kind_(k) {}
    int64_t sent_as(int rank, int64_t l, int64_t per_rank, int ranks) const override {
        if (kind_ == FaultKind::ep_expert_misplaced) return ((rank + 1) % ranks) * per_rank + l;
        return ExpertDispatch::sent_as(rank, l, per_rank, ranks);
    }
    void count(std::vector<int64_t>& n, int64_t per_rank) const override {
        if (kind_ != FaultKind::ep_split_sizes || static_cast<int64_t>(n.size()) <= per_rank) return;
        for (int64_t i = per_rank - 1; i >= 0; --i)  // rank 0's last row, counted as rank 1's first expert's
            if (n[static_cast<size_t>(i)] > 0) {
                --n[static_cast<size_t>(i)], ++n[static_cast<size_t>(per_rank)];
                return;
            }
    }
    bool inverts() const override { return kind_ != FaultKind::ep_combine_unpermuted; }

private:
    FaultKind kind_;
};

// moe_aux_unreduced's router: the model's, whose balancing loss takes each rank's own tokens only.
class LocalBalanceRouter final : public Router {
public:
    bool reduces_balance() const override { return false; }
};

// moe_router_unnormalised's router: the model's routing with norm_topk_prob flipped, in the forward
// and in its backward (a router whose bug is consistent with itself).
class UnnormalisedRouter final : public Router {
public:
    Routing route(const RouterOptions& o, const std::vector<double>& logits,
                  const std::vector<double>& bias) const override {
        return Router::route(flipped(o), logits, bias);
    }
    std::vector<double> backward(const RouterOptions& o, const Routing& r,
                                 const std::vector<double>& d_weights) const override {
        return Router::backward(flipped(o), r, d_weights);
    }

private:
    static RouterOptions flipped(RouterOptions o) {
        o.norm_topk_prob = !o.norm_topk_prob;
        return o;
    }
};

// The context parallel faults on an attention (cp_position_offset, cp_permutation_kept,
// cp_mask_unshifted, cp_merge_unscaled): its forward and backward (and a recompute's) see a
// context shard of the fault's making in place of the run's: the positions 0..t-1; the
// load-balanced positions with the gather's cp order taken for position order (the ring's blocks
// read as contiguous chunks); every ring block's keys at the rank's own positions; or (the shard
// unchanged) a backend whose ring merge drops the max.
class ContextFaultHooks final : public ModuleHooks {
public:
    explicit ContextFaultHooks(FaultKind kind) : kind_(kind) {}
    Placed pre_forward(RunContext& c, Module&, const Placed& x) override {
        swap_in(c);
        return x;
    }
    Placed post_forward(RunContext& c, Module&, const Placed& y) override {
        restore(c);
        return y;
    }
    Placed post_forward_backward(RunContext& c, Module&, const Placed& dy) override {
        swap_in(c);
        return dy;
    }
    Placed pre_forward_backward(RunContext& c, Module&, const Placed& dx) override {
        restore(c);
        return dx;
    }

private:
    void restore(RunContext& c) {
        c.context = real_;
        if (real_backend_) c.backend = real_backend_, real_backend_ = nullptr;
    }
    void swap_in(RunContext& c) {
        real_ = c.context;
        if (!real_ || real_->parts == 1) return;
        if (kind_ == FaultKind::cp_merge_unscaled) {
            real_backend_ = c.backend;
            unscaled_.emplace(*c.backend);
            c.backend = &*unscaled_;
            return;
        }
        wrong_ = *real_;
        if (kind_ == FaultKind::cp_position_offset) {
            for (size_t i = 0; i < wrong_.positions.size(); ++i)
                wrong_.positions[i] = static_cast<int64_t>(i);
        } else if (kind_ == FaultKind::cp_permutation_kept) {
            wrong_.load_balance = false;              // natural() leaves the gathered keys in cp order
            for (int r = 0; r < wrong_.parts; ++r) {  // the ring's blocks read as contiguous chunks
                std::vector<int64_t>& at = wrong_.rank_positions[static_cast<size_t>(r)];
                const int64_t len = static_cast<int64_t>(at.size());
                for (int64_t i = 0; i < len; ++i) at[static_cast<size_t>(i)] = r * len + i;
            }
        } else {  // cp_mask_unshifted: every block masked as the rank's own (the diagonal block's)
            for (auto& at : wrong_.rank_positions) at = wrong_.positions;
        }
        c.context = &wrong_;
    }
    FaultKind kind_;
    const ContextShard* real_ = nullptr;
    ContextShard wrong_;
    Backend* real_backend_ = nullptr;
    std::optional<UnscaledMergeBackend> unscaled_;
};

// sac_stale_output on an op of a region under the op-level selective policy: what it keeps for
// microbatch m >= 1 is replaced by a copy of what it kept for m-1 (a cache looked up one
// microbatch off). The module's own output is left alone: only the recompute sees the stale one.
class StaleKeptHooks final : public ModuleHooks {
public:
    Placed post_forward(RunContext& c, Module& m, const Placed& y) override {
        KeptOutputs* kept = m.kept_outputs();
        Tensor* last = kept && c.selective && !c.recomputing ? kept->last(c.microbatch) : nullptr;
        if (!last) return y;
        if (c.step != step_) before_.clear(), step_ = c.step;
        before_[c.microbatch] = last->clone();
        if (auto it = before_.find(c.microbatch - 1);
            it != before_.end() && it->second.shape() == last->shape())
            *last = it->second.clone();
        return y;
    }

private:
    int64_t step_ = -1;
    std::map<int, Tensor> before_;  // per microbatch: the output kept, as kept
};

// pp_stale_activation on a stage's first module: its forward computes on the activation the stage
// received, but the backward of microbatch m >= 1 finds microbatch m-1's in what the forward saved
// (the stage's saved activations looked up one microbatch off). The module computes on a buffer of
// the hook's, which its saves keep; the buffer gets the previous microbatch's input as the
// backward begins. (A checkpointed first module recomputes from its own copy of the input: not hit.)
class StaleInputHooks final : public ModuleHooks {
public:
    Placed pre_forward(RunContext& c, Module&, const Placed& x) override {
        if (c.recomputing) return x;
        if (c.step != step_) clean_.clear(), used_.clear(), step_ = c.step;
        clean_[c.microbatch] = x.t.clone();
        Tensor buffer = x.t.clone();
        used_[c.microbatch] = buffer;
        return {buffer, x.p, x.global};
    }
    Placed post_forward_backward(RunContext& c, Module&, const Placed& dy) override {
        const auto before = clean_.find(c.microbatch - 1);
        const auto mine = used_.find(c.microbatch);
        if (before != clean_.end() && mine != used_.end()) c.backend->copy(before->second, mine->second);
        return dy;
    }
    void post_backward(RunContext& c, Module&) override {
        clean_.erase(c.microbatch - 1);
        used_.erase(c.microbatch);
    }

private:
    int64_t step_ = -1;
    std::map<int, Tensor> clean_, used_;  // per microbatch: its input as received, and the buffer computed on
};

}  // namespace

std::shared_ptr<ModuleHooks> style_fault_hooks(std::shared_ptr<ModuleHooks> inner, FaultKind kind,
                                               int parts) {
    return std::make_shared<FaultHooks>(std::move(inner), kind, parts);
}
std::shared_ptr<ModuleHooks> module_fault_hooks(FaultKind kind) {
    return std::make_shared<ModuleFaultHooks>(kind);
}
std::shared_ptr<ModuleHooks> context_fault_hooks(FaultKind kind) {
    return std::make_shared<ContextFaultHooks>(kind);
}
std::shared_ptr<ModuleHooks> stale_kept_hooks() {
    return std::make_shared<StaleKeptHooks>();
}
std::shared_ptr<ModuleHooks> stale_input_hooks() {
    return std::make_shared<StaleInputHooks>();
}
std::shared_ptr<Router> unnormalised_router() {
    return std::make_shared<UnnormalisedRouter>();
}
std::shared_ptr<Router> local_balance_router() {
    return std::make_shared<LocalBalanceRouter>();
}
std::shared_ptr<ExpertDispatch> fault_dispatch(FaultKind kind) {
    return std::make_shared<FaultDispatch>(kind);
}

}  // namespace ptool::faults
