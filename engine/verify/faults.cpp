#include "verify/faults.h"

#include <algorithm>
#include <map>
#include <set>

#include "backend/forwarding_backend.h"
#include "core/tensor_ops.h"
#include "model/blocks.h"
#include "model/context_shard.h"
#include "model/moe.h"

namespace ptool {
namespace {

// The table's rows are in the enum's order, so fault_class is an index.
constexpr bool rows_in_enum_order() {
    for (size_t i = 0; i < std::size(kFaultClasses); ++i)
        if (static_cast<size_t>(kFaultClasses[i].kind) != i) return false;
    return true;
}
static_assert(rows_in_enum_order(), "kFaultClasses: one row per FaultKind, in the enum's order");

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
        auto* a = dynamic_cast<Attention*>(&m);
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

// pp_stage_sync_skipped: the fault's pipeline stage as this rank holds it (nothing where the rank
// does not hold it): its parameters' FQNs, and the DDP buckets (root -> bucket K) and fully_shard
// units that hold one of them. Under interleaved_1f1b a rank's buckets and units may hold several
// stages' parameters: a bucket of the stage's is skipped whole.
struct StageParams {
    std::set<const Parameter*> held;  // the stage's parameters (their objects: the names come later)
    std::set<std::string> params;
    std::map<std::string, std::vector<bool>> buckets;
    std::set<std::string> units;
};

// A send's or receive's tag taken apart (train/schedule.h's p2p_tag: 2 * Cantor(microbatch,
// boundary) + direction, boundary b between stages b and b + 1).
struct P2PTagParts {
    int microbatch = 0, boundary = 0;
    bool forward = true;  // an activation (else a gradient)
};
P2PTagParts p2p_tag_parts(int tag) {
    const int64_t pair = tag / 2;
    int64_t w = 0;  // the largest w with w (w + 1) / 2 <= pair
    while ((w + 1) * (w + 2) / 2 <= pair) ++w;
    const int64_t b = pair - w * (w + 1) / 2;
    return {static_cast<int>(w - b), static_cast<int>(b), tag % 2 == 0};
}

// A mesh dim's communicator with the collectives of one scope broken. The scope is the counter's
// module and site (comm/comm_stats.h), which the parallel code sets around its collectives.
// grad_sum's reduction: summed where the run averages, averaged where it sums (global_tokens)
ReduceOp other_reduction(ReduceOp op) {
    return op == ReduceOp::sum ? ReduceOp::avg : ReduceOp::sum;
}

class FaultComm final : public Communicator {
public:
    using Buckets =
        std::map<std::string, std::vector<std::string>>;  // root -> bucket K -> the fault's parameter or ""
    FaultComm(std::unique_ptr<Communicator> inner, Fault fault, const Buckets& buckets,
              const StageParams& stage, bool pp = false, bool ep = false)
        : inner_(std::move(inner)),
          fault_(std::move(fault)),
          buckets_(buckets),
          stage_(stage),
          pp_(pp),
          ep_(ep) {
        set_counter(inner_->counter(), "");  // the inner communicator counts
    }
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string backend() const override { return inner_->backend(); }
    void all_gather(const Tensor& in, Tensor& out) override {
        if (fault_.is(FaultKind::pp_clip_stage_norm) && pp_ && site().is(CommSiteKind::clip_grad_norm) &&
            in.dtype() == DType::float64) {  // the squares (not their counts): this stage's only
            inner_->all_gather(in, out);
            for (int64_t i = 0; i < out.numel(); ++i) out.set(i, i < in.numel() ? in.item(i) : 0.0);
            return;
        }
        if (fault_.hits(FaultKind::zero_skip_gather, module()) && site().is(CommSiteKind::zero_params)) {
            Tensor mine = out.narrow(0, rank() * in.numel(), in.numel());  // its own update only
            backend_for(out.device()).copy(in, mine);
            return;
        }
        if (!fault_.hits(FaultKind::stale_param, module()) || !site().is(CommSiteKind::unshard))
            return inner_->all_gather(in, out);
        auto [it, first] = stale_.try_emplace(module());
        if (first) {
            inner_->all_gather(in, out);
            it->second = out.clone();
        } else {
            backend_for(out.device()).copy(it->second, out);  // the first gather's parameters, again
        }
    }
    void all_reduce(Tensor& t, ReduceOp op) override {
        if ((fault_.is(FaultKind::clip_local_norm) && site().is(CommSiteKind::clip_grad_norm)) ||
            (fault_.is(FaultKind::loss_parallel_local) && site().is(CommSiteKind::loss_parallel)) ||
            (fault_.is(FaultKind::ep_grad_norm_local) && ep_ && site().is(CommSiteKind::clip_grad_norm)))
            return;  // each rank keeps its own (ep_grad_norm_local: its own experts' squares)
        if (fault_.is(FaultKind::pp_tied_unsynced) && site().is(CommSiteKind::tied_weights))
            return;  // each stage keeps the part its own use contributed
        if (fault_.is(FaultKind::cp_grads_unsynced) && site().is(CommSiteKind::context_grads))
            return;  // each cp rank keeps its own tokens' gradient
        if (skips_stage_sync()) return;
        if (site().is(CommSiteKind::bucket)) {
            if (skips_bucket()) return;
            if (fault_.hits(FaultKind::grad_sum, module())) op = other_reduction(op);
            if (fault_.hits(FaultKind::zero_wrong_group, module()) && zero_)
                return wrong_group_ ? wrong_group_->all_reduce(t, op) : void();
        }
        // HSDP: the only all_reduce of a unit's reduce_grads is over the replicate dim; each
        // replica keeps the shard its own dp_shard group averaged
        if (fault_.hits(FaultKind::skip_replicate_all_reduce, module()) &&
            site().is(CommSiteKind::reduce_grads))
            return;
        inner_->all_reduce(t, op);
    }
    void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
        if (site().is(CommSiteKind::bucket)) {  // ZeRO-2's buckets: DDP's faults, and the wrong group
            if (fault_.hits(FaultKind::grad_sum, module())) op = other_reduction(op);
            const bool wrong = fault_.hits(FaultKind::zero_wrong_group, module());
            if (wrong && wrong_group_) return wrong_group_->reduce_scatter(in, out, op);
            if (!wrong && !skips_bucket()) return inner_->reduce_scatter(in, out, op);
        } else if (fault_.hits(FaultKind::cp_kv_grads_local, module()) &&
                   site().is(CommSiteKind::context_kv)) {
            // falls through: this rank's positions of its own queries' key and value gradients
        } else if (!(fault_.hits(FaultKind::skip_reduce_scatter, module()) || skips_stage_sync()) ||
                   !site().is(CommSiteKind::reduce_grads)) {
            return inner_->reduce_scatter(in, out, op);
        }
        const Tensor mine = chunk(in, size(), rank(), 0);  // this rank's rows of its own gradient, unreduced
        backend_for(out.device()).copy(mine, out);
    }
    void broadcast(Tensor& t, int root) override {
        inner_->broadcast(t, fault_.hits(FaultKind::wrong_src_rank, module()) ? (root + 1) % size() : root);
    }
    void all_to_all(const Tensor& in, Tensor& out) override { inner_->all_to_all(in, out); }
    void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                      const std::vector<int64_t>& recv_rows) override {
        inner_->all_to_all_v(in, send_rows, out, recv_rows);
    }
    void barrier() override { inner_->barrier(); }
    void send(const Tensor& t, int peer, int tag) override { inner_->send(t, peer, tag); }
    void recv(Tensor& t, int peer, int tag) override { inner_->recv(t, peer, tag); }
    void batch_isend_irecv(const std::vector<P2POp>& ops) override;
    std::unique_ptr<Communicator> split(int color, int key) override { return inner_->split(color, key); }
    // zero_wrong_group: where a ZeRO bucket's reduction goes instead (null: nowhere, each rank keeps its
    // own); zero: the plan runs ZeRO (plain DDP's buckets are not this fault's)
    void set_wrong_group(Communicator* c, bool zero) { wrong_group_ = c, zero_ = zero; }
    Communicator& inner() { return *inner_; }

private:
    std::string module() const { return counter() ? counter()->module() : ""; }
    CommSite site() const { return counter() ? counter()->site() : CommSite{}; }
    bool skips_stage_sync() const {  // a bucket or fully_shard unit that holds the fault stage's gradients
        if (!fault_.is(FaultKind::pp_stage_sync_skipped)) return false;
        if (site().is(CommSiteKind::reduce_grads)) return stage_.units.count(module()) > 0;
        if (!site().is(CommSiteKind::bucket)) return false;
        auto it = stage_.buckets.find(module());
        const int k = site().bucket;
        return it != stage_.buckets.end() && k >= 0 && static_cast<size_t>(k) < it->second.size() &&
               it->second[static_cast<size_t>(k)];
    }
    bool skips_bucket() const {  // bucket K of module ROOT holds the fault's parameter
        if (!fault_.is(FaultKind::skip_bucket)) return false;
        auto it = buckets_.find(module());
        const int k = site().bucket;
        if (it == buckets_.end() || k < 0 || static_cast<size_t>(k) >= it->second.size()) return false;
        return fault_.fqn == "*" || it->second[static_cast<size_t>(k)] == fault_.fqn;
    }
    std::unique_ptr<Communicator> inner_;
    Fault fault_;
    const Buckets& buckets_;    // the layer's, filled once data parallelism is resolved
    const StageParams& stage_;  // the layer's, filled once data parallelism is resolved
    bool pp_ = false;           // the pp dim's communicator
    bool ep_ = false;           // the ep dim's communicator
    std::map<std::string, Tensor> stale_;
    Communicator* wrong_group_ = nullptr;
    bool zero_ = false;
    std::map<std::pair<int, int>, Tensor>
        sent_;  // pp_wrong_activation: the activations sent, by (boundary, microbatch)
};

// The pp dim's sends, each known by its tag (the microbatch and the boundary it crosses): stage S's
// are its activations over boundary S and its input's gradients over boundary S - 1 (a rank under
// interleaved_1f1b sends for several stages). pp_wrong_activation:S sends microbatch m-1's
// activation again for m's; pp_detached_input:S sends zeros for the input's gradient. A boundary
// between two stages of one rank has no send (the stages hand over in memory): not hit.
void FaultComm::batch_isend_irecv(const std::vector<P2POp>& ops) {
    if (fault_.hits(FaultKind::cp_ring_stale_kv, module()) && site().is(CommSiteKind::context_kv) &&
        std::any_of(ops.begin(), ops.end(), [](const P2POp& op) { return op.tag == ring_key_grads; })) {
        // a backward ring step: the block's gradients move on, its keys and values do not (the rank
        // recomputes the next step with the block it holds: its own, every step)
        inner_->batch_isend_irecv(ops);
        std::map<int, const Tensor*> sent;
        for (const P2POp& op : ops)
            if (op.kind == P2POp::Kind::send) sent[op.tag] = op.tensor;
        for (const P2POp& op : ops)
            if (op.kind == P2POp::Kind::recv && (op.tag == ring_keys || op.tag == ring_values))
                backend_for(op.tensor->device()).copy(*sent.at(op.tag), *op.tensor);
        return;
    }
    if (fault_.hits(FaultKind::cp_kv_grads_local, module()) && site().is(CommSiteKind::context_kv)) {
        // the ring's last hop not taken: each rank keeps the block gradients it holds as its own
        std::vector<P2POp> kept;
        std::map<int, const Tensor*> sent;
        for (const P2POp& op : ops) {
            const bool home = op.tag == ring_return_keys || op.tag == ring_return_values;
            if (!home)
                kept.push_back(op);
            else if (op.kind == P2POp::Kind::send)
                sent[op.tag] = op.tensor;
        }
        for (const P2POp& op : ops)
            if (op.kind == P2POp::Kind::recv && sent.count(op.tag))
                backend_for(op.tensor->device()).copy(*sent[op.tag], *op.tensor);
        if (!kept.empty()) inner_->batch_isend_irecv(kept);
        return;
    }
    const bool wrong = pp_ && fault_.is(FaultKind::pp_wrong_activation);
    const bool detached = pp_ && fault_.is(FaultKind::pp_detached_input);
    if (!wrong && !detached) return inner_->batch_isend_irecv(ops);
    std::vector<P2POp> out = ops;
    std::vector<Tensor> zeros;
    zeros.reserve(ops.size());
    for (P2POp& op : out) {
        if (op.kind != P2POp::Kind::send) continue;
        const P2PTagParts t = p2p_tag_parts(op.tag);
        const int m = t.microbatch, sender = t.forward ? t.boundary : t.boundary + 1;
        if (wrong && t.forward && fault_.hits_stage(FaultKind::pp_wrong_activation, sender)) {
            sent_[{t.boundary, m}] = op.tensor->clone();  // (a step's microbatch 0 has none before it)
            if (auto before = sent_.find({t.boundary, m - 1}); before != sent_.end())
                op.tensor = &before->second;
        } else if (detached && !t.forward && fault_.hits_stage(FaultKind::pp_detached_input, sender)) {
            zeros.push_back(op.tensor->clone());
            backend_for(zeros.back().device()).fill(zeros.back(), 0.0);
            op.tensor = &zeros.back();
        }
    }
    inner_->batch_isend_irecv(out);
}

class FaultLayer final : public RunLayer {
public:
    explicit FaultLayer(Fault f) : fault_(std::move(f)) {}

    bool needs_full_parameters() const override { return true; }

    void wrap_mesh(DeviceMesh& mesh, const Plan& plan) override {
        plan_ = &plan;
        const int pp = plan.pipeline && plan.dims.has(DimRole::pp) ? plan.dims.index(DimRole::pp) : -1;
        const int ep = plan.expert_parallel && plan.dims.has(DimRole::ep) ? plan.dims.index(DimRole::ep) : -1;
        // grad_scale's rank: the last of the stage (of the world without a pipeline), which holds the
        // stage's parameters; the world's last holds the last stage's only
        last_ = true;
        for (int d = 0; d < mesh.ndim(); ++d)
            if (d != pp && mesh.coord(d) != mesh.dims()[d].size - 1) last_ = false;
        for (int d = 0; d < mesh.ndim(); ++d) {
            if (!plan.dims.role(d)) continue;  // a dim no section uses: nothing of the plan's runs on it
            mesh.wrap(d, [&, d, pp, ep](std::unique_ptr<Communicator> c) {
                return std::make_unique<FaultComm>(std::move(c), fault_, buckets_, stage_params_, d == pp,
                                                   d == ep);
            });
        }
        mesh.wrap_groups([&](std::unique_ptr<Communicator> c) {  // fully_shard over dp_shard x cp
            return std::make_unique<FaultComm>(std::move(c), fault_, buckets_, stage_params_, false);
        });
        // zero_wrong_group: a dp dim's ZeRO buckets reduced over the tp dim where it has the same size
        const bool zero = plan.data_parallel && plan.data_parallel->zero_stage > 0;
        if (fault_.is(FaultKind::zero_wrong_group) && zero && plan.dims.has(DimRole::dp_replicate)) {
            const int dp = plan.dims.index(DimRole::dp_replicate);
            Communicator* other = nullptr;
            if (plan.dims.has(DimRole::tp) &&
                mesh.dims()[plan.dims.index(DimRole::tp)].size == mesh.dims()[dp].size)
                other = &dynamic_cast<FaultComm&>(mesh.comm(plan.dims.index(DimRole::tp))).inner();
            dynamic_cast<FaultComm&>(mesh.comm(dp)).set_wrong_group(other, true);
        }
    }

    // pp_loss_unscaled: a microbatch's loss not divided by the microbatches where it should be (a mean
    // per call), divided where it should not (global_tokens' sum over the step's count)
    double loss_scale(double scale, int64_t microbatches) override {
        if (!fault_.is(FaultKind::pp_loss_unscaled)) return scale;
        return scale == 1.0 ? 1.0 / static_cast<double>(microbatches) : 1.0;
    }

    LossNormalization loss_normalization(LossNormalization n) override {
        return fault_.is(FaultKind::loss_per_call) ? LossNormalization::mean_per_call : n;
    }

    // pp_stage_reinit: the stage's gradients start again at each microbatch's backward
    void before_backward(Model& model, int stage, int /*microbatch*/) override {
        if (!fault_.hits_stage(FaultKind::pp_stage_reinit, stage)) return;
        for (const auto& [name, p] : model.named_parameters())
            if (stage_params_.held.count(p.get()) && p->grad.numel() > 0)
                backend_for(p->grad.device()).fill(p->grad, 0.0);
    }

    double clip_norm(double norm, int64_t microbatches) override {
        return fault_.is(FaultKind::grad_norm_per_microbatch) ? norm / static_cast<double>(microbatches)
                                                              : norm;
    }

    std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> c,
                                             const std::string& param) override {
        if (!fault_.hits(FaultKind::pp_tied_unsynced, param)) return c;
        return std::make_unique<FaultComm>(std::move(c), fault_, buckets_, stage_params_);
    }

    // The pipeline faults act on the stage their argument names, wherever this rank holds it (under
    // interleaved_1f1b a rank holds several): its first module, its parameters.
    void held_stages(const std::vector<std::pair<int, std::vector<Module*>>>& stages) override {
        for (const auto& [index, modules] : stages) {
            if (!fault_.kind || fault_class(*fault_.kind).section != FaultSection::pipeline ||
                !fault_.hits_stage(*fault_.kind, index))
                continue;
            if (index > 0 && !modules.empty()) fault_stage_firsts_.push_back(modules.front());
            for (Module* m : modules)
                for_each_param(
                    *m, [&](const std::string&, const ParamPtr& p) { stage_params_.held.insert(p.get()); });
        }
    }

    void before_parallelize(const Model& model, const Resolution& res) override {
        for (const ResolvedStyle& rs : res.styles)
            if (fault_.hits(FaultKind::wrong_shard_dim, rs.fqn) ||
                fault_.hits(FaultKind::wrong_shard_offset, rs.fqn))
                for (const ParamPlacement& pp : rs.entry->style.style->params(*rs.module))
                    if (pp.placement.is_shard())
                        full_[rs.module->param(pp.param).get()] = rs.module->param(pp.param)->value.clone();
        (void)model;
    }

    void after_parallelize(Model& model, const Plan& plan, const Resolution& res, const TpParams& params,
                           DeviceMesh& mesh) override;

    DataParallelResolution data_parallel(const DataParallelResolution& r) override;
    ExpertParallelResolution expert_parallel(const ExpertParallelResolution& r) override {
        ExpertParallelResolution out = r;
        for (const std::string& layer : r.layers)
            if (fault_.hits(FaultKind::ep_grads_wrong_group, layer)) out.wrong_scale.insert(layer);
        if (fault_.is(FaultKind::loss_per_call)) out.grad_reduce = ReduceOp::avg;
        return out;
    }

    void before_gradient_sync(Model& model, Communicator&) override {
        // torch's schedule.step(scale_grads) divides the stage's gradients by its microbatches: again
        const bool twice = fault_.is(FaultKind::pp_grad_scaled_twice);  // stage_params_: the stage's, if held
        const double microbatches =
            plan_ ? static_cast<double>(plan_->microbatches_per_round() * plan_->accumulation_rounds(model))
                  : 1.0;
        for (const auto& [name, p] : model.named_parameters()) {
            Backend& be = backend_for(p->grad.device());
            if (twice && stage_params_.held.count(p.get())) be.scale(p->grad, 1.0 / microbatches, p->grad);
            if (fault_.hits(FaultKind::grad_scale, name) && last_) be.scale(p->grad, 1.001, p->grad);
            if (fault_.is(FaultKind::masters_rounded) && plan_ &&
                plan_->mixed_precision)  // the optimizer steps param_dtype values
                be.copy(to_dtype(be, p->value, plan_->mixed_precision->param_dtype), p->value);
        }
    }

private:
    Fault fault_;
    const Plan* plan_ = nullptr;
    bool last_ = false;  // the stage's last rank (the world's without a pipeline)
    FaultComm::Buckets buckets_;
    // a pipeline fault's stages (one, or every one for *) this rank holds: the first module of each
    // but stage 0 (pp_stale_activation's), their parameters
    std::vector<Module*> fault_stage_firsts_;
    StageParams stage_params_;
    std::map<const Parameter*, Tensor> full_;
};

// wrong_shard_offset: the rank's chunk one row later (earlier at the end); wrong_shard_dim: the
// chunk along the other dim poured into this shard's shape.
Tensor wrong_shard(const Fault& f, const Tensor& full, int64_t dim, int n, int r, const Tensor& local) {
    if (local.numel() == 0) return local;
    if (f.is(FaultKind::wrong_shard_offset)) {
        const Chunk c = chunk_of(full.size(dim), n, r);
        const int64_t start = c.offset + c.length < full.size(dim) ? c.offset + 1 : c.offset - 1;
        return start >= 0 ? full.narrow(dim, start, c.length).clone() : local;
    }
    if (full.dim() != 2) return local;
    const Tensor other = chunk(full, n, r, 1 - dim);
    Tensor out = local.clone();
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, other.numel() ? other.item(i % other.numel()) : 0.0);
    return out;
}

void FaultLayer::after_parallelize(Model& model, const Plan& plan, const Resolution& res,
                                   const TpParams& params, DeviceMesh& mesh) {
    if (fault_.is(FaultKind::skip_buffer_broadcast) && plan.data_parallel) {
        // the replicas start apart, as DDP's do before its broadcast, and the broadcast never comes
        int dp_rank = 0;  // among every data rank
        for (int d : plan.dims.data_dims()) dp_rank = dp_rank * mesh.dims()[d].size + mesh.coord(d);
        for (const auto& [name, b] : model.named_buffers())
            if (dp_rank != 0 && res.dp.synced_buffers.count(name)) poison_replica(b->value, dp_rank);
    }
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        const bool dropout = dynamic_cast<const Dropout*>(&m) != nullptr;
        if (fault_.hits(FaultKind::tied_grad, fqn) ||
            (dynamic_cast<const Attention*>(&m) && fault_.hits(FaultKind::cp_balance_noncausal, fqn)) ||
            (dropout &&
             (fault_.hits(FaultKind::dropout_same_mask, fqn) || fault_.hits(FaultKind::recompute_mask, fqn))))
            m.add_outer_hooks(std::make_shared<ModuleFaultHooks>(*fault_.kind));
    });
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        if (dynamic_cast<const Attention*>(&m) && (fault_.hits(FaultKind::cp_position_offset, fqn) ||
                                                   fault_.hits(FaultKind::cp_permutation_kept, fqn) ||
                                                   fault_.hits(FaultKind::cp_mask_unshifted, fqn) ||
                                                   fault_.hits(FaultKind::cp_merge_unscaled, fqn)))
            m.add_outer_hooks(std::make_shared<ContextFaultHooks>(*fault_.kind));
    });
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        auto* moe = dynamic_cast<Moe*>(&m);
        if (!moe) return;
        if (fault_.hits(FaultKind::moe_router_unnormalised, fqn))
            moe->set_router(std::make_shared<UnnormalisedRouter>());
        if (fault_.hits(FaultKind::moe_aux_unreduced, fqn))
            moe->set_router(std::make_shared<LocalBalanceRouter>());
        for (FaultKind k :
             {FaultKind::ep_split_sizes, FaultKind::ep_combine_unpermuted, FaultKind::ep_expert_misplaced})
            if (fault_.hits(k, fqn)) moe->set_dispatch(std::make_shared<FaultDispatch>(k));
    });
    if (fault_.is(FaultKind::sac_stale_output))  // every op under the region the fault names
        for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
            if (!m.selective() || !fault_.hits(FaultKind::sac_stale_output, fqn)) return;
            for_each_module(m, [&](const std::string&, Module& op) {
                if (op.kept_outputs()) op.add_outer_hooks(std::make_shared<StaleKeptHooks>());
            });
        });
    if (fault_.is(FaultKind::pp_stale_activation))
        for (Module* first : fault_stage_firsts_) first->add_outer_hooks(std::make_shared<StaleInputHooks>());
    if (!stage_params_.held.empty())  // pp_stage_sync_skipped's names of the stage's parameters
        for (const auto& [name, p] : model.named_parameters())
            if (stage_params_.held.count(p.get())) stage_params_.params.insert(name);
    if (!plan.dims.has(DimRole::tp)) return;
    Communicator& tp = mesh.comm(plan.dims.index(DimRole::tp));
    for (const ResolvedStyle& rs : res.styles) {
        if (fault_.hits(FaultKind::skip_all_reduce, rs.fqn) ||
            fault_.hits(FaultKind::bias_every_rank, rs.fqn) ||
            fault_.hits(FaultKind::skip_grad_all_reduce, rs.fqn))
            rs.module->set_hooks(std::make_shared<FaultHooks>(rs.module->hooks(), *fault_.kind, tp.size()));
        // moe_tp_grad_unreduced: a moe layer's routed experts' partial input gradients kept as they are
        if (const size_t at = rs.fqn.find(".experts.");
            at != std::string::npos && fault_.hits(FaultKind::moe_tp_grad_unreduced, rs.fqn.substr(0, at)))
            rs.module->set_hooks(
                std::make_shared<FaultHooks>(rs.module->hooks(), FaultKind::skip_grad_all_reduce, tp.size()));
        for (const auto& [pp, full] : full_) {
            const ParamPtr p = rs.module->param("weight") && rs.module->param("weight").get() == pp
                                   ? rs.module->param("weight")
                               : rs.module->param("bias") && rs.module->param("bias").get() == pp
                                   ? rs.module->param("bias")
                                   : nullptr;
            if (!p) continue;
            const int64_t dim = normalize_dim(params.at(pp).placement.dim, full.dim());
            p->value = wrong_shard(fault_, full, dim, tp.size(), tp.rank(), p->value);
        }
    }
}

DataParallelResolution FaultLayer::data_parallel(const DataParallelResolution& r) {
    DataParallelResolution out = r;
    if (fault_.is(FaultKind::loss_per_call)) out.grad_reduce = ReduceOp::avg;  // DDP's average of the means
    if (fault_.is(FaultKind::skip_buffer_broadcast)) out.synced_buffers.clear();
    if (fault_.is(FaultKind::zero_wrong_offset) && out.zero_stage > 0) out.zero_rotation = 1;
    if (fault_.is(FaultKind::ep_shared_unsynced)) {  // the shared expert's parameters synchronised by no one
        auto shared = [&](const std::string& name) {
            return fault_.fqn == "*" ? name.find(".shared_expert.") != std::string::npos
                                     : name.rfind(fault_.fqn + ".shared_expert.", 0) == 0;
        };
        for (auto& replica : out.replicas)
            for (BucketSpec& b : replica.buckets) std::erase_if(b.params, shared);
        for (FsdpUnitSpec& u : out.units) std::erase_if(u.params, shared);
    }
    if (fault_.is(FaultKind::sync_ignored) &&
        !out.ignored_params.empty()) {  // averaged in a bucket of their own
        if (out.replicas.empty()) out.replicas.push_back({"", {}});
        BucketSpec b;
        b.params.assign(out.ignored_params.begin(), out.ignored_params.end());
        out.replicas[0].buckets.push_back(b);
        out.ignored_params.clear();
    }
    auto of_stage = [&](const std::vector<std::string>& params) {
        return std::any_of(params.begin(), params.end(),
                           [&](const std::string& q) { return stage_params_.params.count(q) > 0; });
    };
    for (const auto& replica : out.replicas)  // skip_bucket: which bucket K of a root holds the parameter
        for (const BucketSpec& b : replica.buckets) {
            const bool holds = std::find(b.params.begin(), b.params.end(), fault_.fqn) != b.params.end();
            buckets_[replica.root].push_back(holds ? fault_.fqn : std::string());
            stage_params_.buckets[replica.root].push_back(of_stage(b.params));
        }
    for (const FsdpUnitSpec& u : out.units)
        if (of_stage(u.params)) stage_params_.units.insert(u.fqn);
    return out;
}

}  // namespace

const FaultClass& fault_class(FaultKind k) {
    return kFaultClasses[static_cast<size_t>(k)];
}

const char* fault_section_name(FaultSection s) {
    switch (s) {
        case FaultSection::tensor_parallel:
            return "tensor parallel";
        case FaultSection::data_parallel:
            return "data parallel";
        case FaultSection::training:
            return "training configurations";
        case FaultSection::mixed_precision:
            return "mixed precision";
        case FaultSection::pipeline:
            return "pipeline parallel";
        case FaultSection::context:
            return "context parallel";
        case FaultSection::experts:
            return "mixture of experts";
    }
    return "";
}

Fault parse_fault(const char* text) {
    Fault f;
    if (!text || !*text) return f;
    const std::string s(text);
    const size_t colon = s.find(':');
    const std::string kind = s.substr(0, colon);
    f.fqn = colon == std::string::npos ? "" : s.substr(colon + 1);
    std::vector<std::string> names;
    for (const FaultClass& c : kFaultClasses) {
        names.push_back(c.name);
        if (kind == c.name) f.kind = c.kind;
    }
    if (!f.kind || f.fqn.empty())
        throw InputError(
            fmt::format("PTOOL_FAULT='{}': expected KIND:FQN (or KIND:* for every place) with KIND one of {}",
                        s, fmt::join(names, ", ")));
    return f;
}

std::unique_ptr<RunLayer> fault_layer(const Fault& fault) {
    if (fault.empty()) return nullptr;
    return std::make_unique<FaultLayer>(fault);
}

}  // namespace ptool
