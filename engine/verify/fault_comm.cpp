#include "verify/fault_comm.h"

#include <algorithm>

#include "core/tensor_ops.h"

namespace ptool::faults {
namespace {

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
    using Buckets = FaultBuckets;
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

}  // namespace

std::unique_ptr<Communicator> fault_comm(std::unique_ptr<Communicator> inner, const Fault& fault,
                                         const FaultBuckets& buckets, const StageParams& stage, bool pp,
                                         bool ep) {
    return std::make_unique<FaultComm>(std::move(inner), fault, buckets, stage, pp, ep);
}

void set_wrong_group(Communicator& fault_comm, Communicator* other) {
    dynamic_cast<FaultComm&>(fault_comm).set_wrong_group(other, true);
}

Communicator& inner_of(Communicator& fault_comm) {
    return dynamic_cast<FaultComm&>(fault_comm).inner();
}

}  // namespace ptool::faults
