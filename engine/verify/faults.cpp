#include "verify/faults.h"

#include <algorithm>
#include <map>

#include "core/tensor_ops.h"
#include "train/stage.h"

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
    Placed pre_forward(RunContext& c, Module&, const Placed& x) override {
        if (kind_ == FaultKind::recompute_mask && c.recomputing) c.step += 1000003, shifted_ = true;
        if (kind_ != FaultKind::dropout_same_mask) return x;
        layouts_.push(c.microbatch, x.layout());
        if (c.recording) backward_layouts_.push(c.microbatch, x.layout());
        return {x.t, Placement::replicate(), x.t.shape()};
    }
    Placed post_forward(RunContext& c, Module&, const Placed& y) override {
        if (shifted_) c.step -= 1000003, shifted_ = false;
        if (kind_ != FaultKind::dropout_same_mask) return y;
        const Layout l = layouts_.pop(c.microbatch);
        return {y.t, l.p, l.global};
    }
    Placed pre_forward_backward(RunContext& c, Module&, const Placed& dx) override {
        if (kind_ != FaultKind::dropout_same_mask || backward_layouts_.empty(c.microbatch)) return dx;
        const Layout l = backward_layouts_.pop(c.microbatch);  // the input's true layout, for its gradient
        return {dx.t, grad_placement(l.p), l.global};
    }
    Placed post_forward_backward(RunContext& c, Module& m, const Placed& dy) override {
        if (kind_ == FaultKind::tied_grad && m.param("weight"))
            kept_.push(c.microbatch, m.param("weight")->grad.clone());
        return dy;
    }
    void post_backward(RunContext& c, Module& m) override {
        if (kind_ != FaultKind::tied_grad || kept_.empty(c.microbatch)) return;
        c.backend->copy(kept_.pop(c.microbatch), m.param("weight")->grad);
    }

private:
    FaultKind kind_;
    MicrobatchStack<Layout> layouts_, backward_layouts_;
    MicrobatchStack<Tensor> kept_;
    bool shifted_ = false;
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

// Where a communicator of the fault layer's sits: this rank's pipeline stage (-1: no pipeline) and
// whether it is the pp dim's.
struct CommPlace {
    int stage = -1;
    bool pp = false;
};

// A mesh dim's communicator with the collectives of one scope broken. The scope is the counter's
// module and site (comm/comm_stats.h), which the parallel code sets around its collectives.
class FaultComm final : public Communicator {
public:
    using Buckets =
        std::map<std::string, std::vector<std::string>>;  // root -> bucket K -> the fault's parameter or ""
    FaultComm(std::unique_ptr<Communicator> inner, Fault fault, const Buckets& buckets, CommPlace place = {})
        : inner_(std::move(inner)), fault_(std::move(fault)), buckets_(buckets), place_(place) {
        set_counter(inner_->counter(), "");  // the inner communicator counts
    }
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string backend() const override { return inner_->backend(); }
    void all_gather(const Tensor& in, Tensor& out) override {
        if (fault_.is(FaultKind::pp_clip_stage_norm) && place_.pp &&
            site().is(CommSiteKind::clip_grad_norm) &&
            in.dtype() == DType::float64) {  // the squares (not their counts): this stage's only
            inner_->all_gather(in, out);
            for (int64_t i = 0; i < out.numel(); ++i) out.set(i, i < in.numel() ? in.item(i) : 0.0);
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
            (fault_.is(FaultKind::loss_parallel_local) && site().is(CommSiteKind::loss_parallel)))
            return;  // each rank keeps its own
        if (fault_.is(FaultKind::pp_tied_unsynced) && site().is(CommSiteKind::tied_weights))
            return;  // each stage keeps the part its own use contributed
        if (skips_stage_sync() && (site().is(CommSiteKind::bucket) || site().is(CommSiteKind::reduce_grads)))
            return;
        if (site().is(CommSiteKind::bucket)) {
            if (skips_bucket()) return;
            if (fault_.hits(FaultKind::grad_sum, module())) op = ReduceOp::sum;
        }
        // HSDP: the only all_reduce of a unit's reduce_grads is over the replicate dim; each
        // replica keeps the shard its own dp_shard group averaged
        if (fault_.hits(FaultKind::skip_replicate_all_reduce, module()) &&
            site().is(CommSiteKind::reduce_grads))
            return;
        inner_->all_reduce(t, op);
    }
    void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
        if (!(fault_.hits(FaultKind::skip_reduce_scatter, module()) || skips_stage_sync()) ||
            !site().is(CommSiteKind::reduce_grads))
            return inner_->reduce_scatter(in, out, op);
        const Tensor mine = chunk(in, size(), rank(), 0);  // this rank's rows of its own gradient, unreduced
        backend_for(out.device()).copy(mine, out);
    }
    void broadcast(Tensor& t, int root) override {
        inner_->broadcast(t, fault_.hits(FaultKind::wrong_src_rank, module()) ? (root + 1) % size() : root);
    }
    void all_to_all(const Tensor& in, Tensor& out) override { inner_->all_to_all(in, out); }
    void barrier() override { inner_->barrier(); }
    void send(const Tensor& t, int peer, int tag) override { inner_->send(t, peer, tag); }
    void recv(Tensor& t, int peer, int tag) override { inner_->recv(t, peer, tag); }
    void batch_isend_irecv(const std::vector<P2POp>& ops) override;
    std::unique_ptr<Communicator> split(int color, int key) override { return inner_->split(color, key); }

private:
    std::string module() const { return counter() ? counter()->module() : ""; }
    CommSite site() const { return counter() ? counter()->site() : CommSite{}; }
    bool skips_stage_sync() const {
        return fault_.hits_stage(FaultKind::pp_stage_sync_skipped, place_.stage);
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
    const Buckets& buckets_;  // the layer's, filled once data parallelism is resolved
    CommPlace place_;
    std::map<std::string, Tensor> stale_;
    std::map<int, Tensor> sent_;  // pp_wrong_activation: the activations sent, by microbatch
};

// The pp dim's sends (train/schedule.h's p2p_tag: 2m for microbatch m's activation, 2m + 1 for
// its gradient): pp_wrong_activation sends microbatch m-1's activation again for m's;
// pp_detached_input sends zeros for the input's gradient.
void FaultComm::batch_isend_irecv(const std::vector<P2POp>& ops) {
    const bool wrong = place_.pp && fault_.hits_stage(FaultKind::pp_wrong_activation, place_.stage);
    const bool detached = place_.pp && fault_.hits_stage(FaultKind::pp_detached_input, place_.stage);
    if (!wrong && !detached) return inner_->batch_isend_irecv(ops);
    std::vector<P2POp> out = ops;
    std::vector<Tensor> zeros;
    zeros.reserve(ops.size());
    for (P2POp& op : out) {
        if (op.kind != P2POp::Kind::send) continue;
        const int m = op.tag / 2;
        if (wrong && op.tag % 2 == 0) {
            if (m == 0) sent_.clear();  // a step's first
            sent_[m] = op.tensor->clone();
            if (auto before = sent_.find(m - 1); before != sent_.end()) op.tensor = &before->second;
        } else if (detached && op.tag % 2 == 1) {
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
        stage_ = pp >= 0 ? mesh.coord(pp) : -1;
        // grad_scale's rank: the last of the stage (of the world without a pipeline), which holds the
        // stage's parameters; the world's last holds the last stage's only
        last_ = true;
        for (int d = 0; d < mesh.ndim(); ++d)
            if (d != pp && mesh.coord(d) != mesh.dims()[d].size - 1) last_ = false;
        for (int d = 0; d < mesh.ndim(); ++d) {
            if (!plan.dims.role(d)) continue;  // a dim no section uses: nothing of the plan's runs on it
            mesh.wrap(d, [&, d, pp](std::unique_ptr<Communicator> c) {
                return std::make_unique<FaultComm>(std::move(c), fault_, buckets_,
                                                   CommPlace{stage_, d == pp});
            });
        }
    }

    double loss_scale(double scale) override { return fault_.is(FaultKind::pp_loss_unscaled) ? 1.0 : scale; }

    std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> c,
                                             const std::string& param) override {
        if (!fault_.hits(FaultKind::pp_tied_unsynced, param)) return c;
        return std::make_unique<FaultComm>(std::move(c), fault_, buckets_, CommPlace{stage_, false});
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

    void before_gradient_sync(Model& model, Communicator&) override {
        // torch's schedule.step(scale_grads) divides the stage's gradients by its microbatches: again
        const bool twice = fault_.hits_stage(FaultKind::pp_grad_scaled_twice, stage_);
        const double microbatches =
            plan_ ? static_cast<double>(plan_->microbatches_per_round() * model.gradient_accumulation) : 1.0;
        for (const auto& [name, p] : model.named_parameters()) {
            Backend& be = backend_for(p->grad.device());
            if (twice) be.scale(p->grad, 1.0 / microbatches, p->grad);
            if (fault_.hits(FaultKind::grad_scale, name) && last_) be.scale(p->grad, 1.001, p->grad);
            if (fault_.is(FaultKind::masters_rounded) && plan_ &&
                plan_->mixed_precision)  // the optimizer steps param_dtype values
                be.copy(to_dtype(be, p->value, plan_->mixed_precision->param_dtype), p->value);
        }
    }

private:
    Fault fault_;
    const Plan* plan_ = nullptr;
    int stage_ = -1;     // this rank's pipeline stage (-1: no pipeline)
    bool last_ = false;  // the stage's last rank (the world's without a pipeline)
    FaultComm::Buckets buckets_;
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
            (dropout &&
             (fault_.hits(FaultKind::dropout_same_mask, fqn) || fault_.hits(FaultKind::recompute_mask, fqn))))
            m.add_outer_hooks(std::make_shared<ModuleFaultHooks>(*fault_.kind));
    });
    if (stage_ > 0 && fault_.hits_stage(FaultKind::pp_stale_activation, stage_)) {
        const std::vector<Module*> spine = model_spine(model);  // the stage's modules: the rest are gone
        if (!spine.empty()) spine.front()->add_outer_hooks(std::make_shared<StaleInputHooks>());
    }
    if (!plan.dims.has(DimRole::tp)) return;
    Communicator& tp = mesh.comm(plan.dims.index(DimRole::tp));
    for (const ResolvedStyle& rs : res.styles) {
        if (fault_.hits(FaultKind::skip_all_reduce, rs.fqn) ||
            fault_.hits(FaultKind::bias_every_rank, rs.fqn) ||
            fault_.hits(FaultKind::skip_grad_all_reduce, rs.fqn))
            rs.module->set_hooks(std::make_shared<FaultHooks>(rs.module->hooks(), *fault_.kind, tp.size()));
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
    if (fault_.is(FaultKind::skip_buffer_broadcast)) out.synced_buffers.clear();
    if (fault_.is(FaultKind::sync_ignored) &&
        !out.ignored_params.empty()) {  // averaged in a bucket of their own
        if (out.replicas.empty()) out.replicas.push_back({"", {}});
        BucketSpec b;
        b.params.assign(out.ignored_params.begin(), out.ignored_params.end());
        out.replicas[0].buckets.push_back(b);
        out.ignored_params.clear();
    }
    for (const auto& replica : out.replicas)  // skip_bucket: which bucket K of a root holds the parameter
        for (const BucketSpec& b : replica.buckets) {
            const bool holds = std::find(b.params.begin(), b.params.end(), fault_.fqn) != b.params.end();
            buckets_[replica.root].push_back(holds ? fault_.fqn : std::string());
        }
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
