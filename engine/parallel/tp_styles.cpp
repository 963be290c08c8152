#include "parallel/tp_styles.h"

#include "core/tensor_ops.h"

namespace ptool {
namespace {

Placement grad_placement_of(const Placement& p) { return p.is_partial() ? Placement::replicate() : p; }

struct Shapes {
    Shape in_global, out_global;
};

// Shared by the styles: the per-call saves of a module (a shared module runs twice per step).
class StyleHooks : public ModuleHooks {
protected:
    explicit StyleHooks(std::shared_ptr<TpState> s) : st_(std::move(s)) {}
    Communicator& comm() { return *st_->comm; }
    Shapes& top() { return saved_.back(); }
    // A local output holding this rank's columns of a last dim of `full_last`, handed on as `out`.
    Tensor from_last_dim_shard(const Tensor& y, int64_t full_last, const Placement& out) {
        top().out_global = y.shape();
        top().out_global.back() = full_last;
        st_->act = out;
        return redistribute(y, Placement::shard(-1), out, top().out_global, comm());
    }
    std::shared_ptr<TpState> st_;
    std::vector<Shapes> saved_;
};

class ColwiseHooks final : public StyleHooks {
public:
    ColwiseHooks(const StyleSpec& s, Linear& lin, std::shared_ptr<TpState> st)
        : StyleHooks(std::move(st)), in_(s.input_layouts.value_or(Placement::replicate())),
          out_(s.output_layouts.value_or(Placement::shard(-1))), out_features_(lin.out_features()) {}

    Tensor pre_forward(RunContext&, Module&, const Tensor& x) override {
        saved_.push_back({global_shape(x, in_, comm()), {}});
        st_->act = Placement::replicate();
        return redistribute(x, in_, Placement::replicate(), top().in_global, comm());
    }
    Tensor post_forward(RunContext&, Module&, const Tensor& y) override {
        return from_last_dim_shard(y, out_features_, out_);
    }
    Tensor post_forward_backward(RunContext&, Module&, const Tensor& dy) override {
        Tensor d = redistribute_backward(dy, grad_placement_of(out_), Placement::shard(-1), top().out_global, comm());
        st_->grad = Placement::shard(-1);
        return d;
    }
    Tensor pre_forward_backward(RunContext&, Module& m, const Tensor& dx) override {
        // dx is Partial: each rank holds dy_local @ W_local
        const Placement from = st_->fault.hits("skip_grad_all_reduce", m.fqn()) ? Placement::replicate()
                                                                                 : Placement::partial();
        Tensor d = redistribute(dx, from, grad_placement_of(in_), top().in_global, comm());
        st_->grad = grad_placement_of(in_);
        saved_.pop_back();
        return d;
    }

private:
    Placement in_, out_;
    int64_t out_features_;
};

class RowwiseHooks final : public StyleHooks {
public:
    RowwiseHooks(const StyleSpec& s, Linear& lin, std::shared_ptr<TpState> st)
        : StyleHooks(std::move(st)), in_(s.input_layouts.value_or(Placement::shard(-1))),
          out_(s.output_layouts.value_or(Placement::replicate())), in_features_(lin.in_features()) {
        lin.set_defer_bias(true);
    }

    Tensor pre_forward(RunContext&, Module&, const Tensor& x) override {
        Shape g = x.shape();
        if (in_.normalized(x.dim()).same_as(Placement::shard(-1), x.dim())) g.back() = in_features_;
        else g = global_shape(x, in_, comm());
        saved_.push_back({g, {}});
        st_->act = Placement::shard(-1);
        return redistribute(x, in_, Placement::shard(-1), g, comm());
    }
    Tensor post_forward(RunContext& ctx, Module& m, const Tensor& y) override {
        top().out_global = y.shape();
        ParamPtr bias = m.param("bias");
        Tensor partial = y;
        if (bias && st_->fault.hits("bias_every_rank", m.fqn())) {  // the bug: bias added before the reduction
            partial = y.clone();
            ctx.backend->add_bias(partial, bias->value);
        }
        Tensor out = st_->fault.hits("skip_all_reduce", m.fqn())
                         ? redistribute(partial, Placement::replicate(), out_, top().out_global, comm())
                         : redistribute(partial, Placement::partial(), out_, top().out_global, comm());
        if (bias && !st_->fault.hits("bias_every_rank", m.fqn())) {
            if (out.shares_storage(y)) out = out.clone();
            Tensor b = bias_piece(bias->value, out.dim());
            Tensor rows = out.reshape({out.numel() / b.numel(), b.numel()});
            ctx.backend->add_bias(rows, b);
        }
        st_->act = out_;
        return out;
    }
    Tensor post_forward_backward(RunContext& ctx, Module& m, const Tensor& dy) override {
        if (ParamPtr bias = m.param("bias")) {
            Tensor piece = Tensor::empty({dy.size(-1)}, dy.dtype(), dy.device());
            ctx.backend->sum_rows(dy.reshape({dy.numel() / dy.size(-1), dy.size(-1)}), piece, false);
            // the bias is Replicate: its gradient must be the full sum on every rank
            const Placement g = grad_placement_of(out_).normalized(dy.dim());
            Placement as = Placement::replicate();
            if (g.is_partial() || (g.is_shard() && g.dim != dy.dim() - 1)) as = Placement::partial();
            if (g.is_shard() && g.dim == dy.dim() - 1) as = Placement::shard(0);
            ctx.backend->axpy(1.0, redistribute(piece, as, Placement::replicate(), bias->value.shape(), comm()), bias->grad);
        }
        Tensor d = redistribute_backward(dy, grad_placement_of(out_), Placement::partial(), top().out_global, comm());
        st_->grad = Placement::replicate();
        return d;
    }
    Tensor pre_forward_backward(RunContext&, Module&, const Tensor& dx) override {
        Tensor d = redistribute_backward(dx, Placement::shard(-1), in_, top().in_global, comm());
        st_->grad = grad_placement_of(in_);
        saved_.pop_back();
        return d;
    }

private:
    Tensor bias_piece(const Tensor& b, int64_t out_dim) {
        const Placement o = out_.normalized(out_dim);
        if (o.is_shard() && o.dim == out_dim - 1) return chunk(b, comm().size(), comm().rank(), 0);
        return b;
    }
    Placement in_, out_;
    int64_t in_features_;
};

class PrepareHooks final : public StyleHooks {
public:
    PrepareHooks(const StyleSpec& s, std::shared_ptr<TpState> st)
        : StyleHooks(std::move(st)), in_(s.input_layouts), want_in_(s.desired_input_layouts), out_(s.output_layouts),
          want_out_(s.desired_output_layouts) {}

    Tensor pre_forward(RunContext&, Module&, const Tensor& x) override {
        saved_.push_back({});
        if (!in_) return x;
        top().in_global = global_shape(x, *in_, comm());
        st_->act = *want_in_;
        return redistribute(x, *in_, *want_in_, top().in_global, comm());
    }
    Tensor post_forward(RunContext&, Module&, const Tensor& y) override {
        if (!out_) return y;
        top().out_global = global_shape(y, *out_, comm());
        st_->act = *want_out_;
        return redistribute(y, *out_, *want_out_, top().out_global, comm());
    }
    Tensor post_forward_backward(RunContext&, Module&, const Tensor& dy) override {
        if (!out_) return dy;
        Tensor d = redistribute_backward(dy, grad_placement_of(*want_out_), *out_, top().out_global, comm());
        st_->grad = grad_placement_of(*out_);
        return d;
    }
    Tensor pre_forward_backward(RunContext&, Module&, const Tensor& dx) override {
        Tensor d = dx;
        if (in_) {
            d = redistribute_backward(dx, grad_placement_of(*want_in_), *in_, top().in_global, comm());
            st_->grad = grad_placement_of(*in_);
        }
        saved_.pop_back();
        return d;
    }

private:
    std::optional<Placement> in_, want_in_, out_, want_out_;
};

// Embedding colwise: the embedding dim is sharded (weight Shard(1)); output Shard(-1).
class ColwiseEmbeddingHooks final : public StyleHooks {
public:
    ColwiseEmbeddingHooks(const StyleSpec& s, Embedding& e, std::shared_ptr<TpState> st)
        : StyleHooks(std::move(st)), out_(s.output_layouts.value_or(Placement::shard(-1))), dim_(e.dim()) {}
    Tensor pre_forward(RunContext&, Module&, const Tensor& ids) override {
        saved_.push_back({});
        return ids;  // ids are replicated
    }
    Tensor post_forward(RunContext&, Module&, const Tensor& y) override { return from_last_dim_shard(y, dim_, out_); }
    Tensor post_forward_backward(RunContext&, Module&, const Tensor& dy) override {
        Tensor d = redistribute_backward(dy, grad_placement_of(out_), Placement::shard(-1), top().out_global, comm());
        saved_.pop_back();  // ids have no gradient: pre_forward_backward never runs
        return d;
    }

private:
    Placement out_;
    int64_t dim_;
};

// Embedding rowwise (vocab-parallel): the vocabulary is sharded (weight Shard(0)); each rank looks
// up the ids it holds, zeros for the rest, so the output is Partial -> output_layouts.
class RowwiseEmbeddingHooks final : public StyleHooks {
public:
    RowwiseEmbeddingHooks(const StyleSpec& s, std::shared_ptr<TpState> st)
        : StyleHooks(std::move(st)), out_(s.output_layouts.value_or(Placement::replicate())) {}
    Tensor pre_forward(RunContext&, Module&, const Tensor& ids) override {
        saved_.push_back({});
        return ids;
    }
    Tensor post_forward(RunContext&, Module&, const Tensor& y) override {
        top().out_global = y.shape();
        st_->act = out_;
        return redistribute(y, Placement::partial(), out_, top().out_global, comm());
    }
    Tensor post_forward_backward(RunContext&, Module&, const Tensor& dy) override {
        Tensor d = redistribute_backward(dy, grad_placement_of(out_), Placement::partial(), top().out_global, comm());
        saved_.pop_back();
        return d;
    }

private:
    Placement out_;
};

// sequence_parallel (Megatron-SP) on layer_norm / rms_norm / dropout: the activation stays
// Shard(1) (sequence), the module runs on its local rows, and its replicated parameters' gradients,
// each a sum over this rank's rows only, are all_reduced.
class SequenceParallelHooks final : public StyleHooks {
public:
    explicit SequenceParallelHooks(std::shared_ptr<TpState> st) : StyleHooks(std::move(st)) {}
    Tensor pre_forward(RunContext&, Module&, const Tensor& x) override {
        st_->act = Placement::shard(1);
        return x;
    }
    Tensor post_forward_backward(RunContext&, Module& m, const Tensor& dy) override {
        std::vector<Tensor> before;  // this call's contribution is what backward adds to the grads
        for (const auto& e : m.params()) before.push_back(e.param->grad.clone());
        snapshots_.push_back(std::move(before));
        return dy;
    }
    Tensor pre_forward_backward(RunContext& ctx, Module& m, const Tensor& dx) override {
        std::vector<Tensor> before = std::move(snapshots_.back());
        snapshots_.pop_back();
        for (size_t i = 0; i < m.params().size(); ++i) {
            Tensor& g = m.params()[i].param->grad;
            Tensor delta = g.clone();
            ctx.backend->axpy(-1.0, before[i], delta);  // this call's contribution
            comm().all_reduce(delta, ReduceOp::sum);    // Partial -> Replicate
            ctx.backend->add(before[i], delta, g);
        }
        st_->grad = Placement::shard(1);
        return dx;
    }

private:
    std::vector<std::vector<Tensor>> snapshots_;
};

}  // namespace

void poison_replica(Tensor& t, int rank) {  // t := 0.25 + rank - t / 2
    if (t.dtype() == DType::int64 || t.dtype() == DType::int32) {  // counters (num_batches_tracked): few elements
        for (int64_t k = 0; k < t.numel(); ++k) t.set(k, t.item(k) + 1 + rank);
        return;
    }
    Backend& be = backend_for(t.device());
    Tensor shift = Tensor::empty(t.shape(), t.dtype(), t.device());
    be.fill(shift, 0.25 + rank);
    be.axpy(-0.5, t, shift);
    be.copy(shift, t);
}

Fault parse_fault(const char* env) {
    Fault f;
    if (!env || !*env) return f;
    const std::string s(env);
    const size_t colon = s.find(':');
    f.kind = s.substr(0, colon);
    f.fqn = colon == std::string::npos ? "" : s.substr(colon + 1);
    const std::vector<std::string> kinds = {"skip_all_reduce",  "bias_every_rank",       "skip_grad_all_reduce",
                                            "wrong_shard_dim",  "wrong_shard_offset",    "wrong_src_rank",
                                            "skip_bucket",      "grad_sum",              "skip_buffer_broadcast",
                                            "sync_ignored",     "skip_reduce_scatter",   "stale_param"};
    if (std::find(kinds.begin(), kinds.end(), f.kind) == kinds.end() || f.fqn.empty())
        throw InputError(fmt::format("PTOOL_FAULT='{}': expected KIND:FQN (or KIND:* for every place) with KIND one of {}",
                                     s, fmt::join(kinds, ", ")));
    return f;
}

Shape global_shape(const Tensor& local, const Placement& p, Communicator& comm) {
    if (!p.is_shard()) return local.shape();
    const int64_t d = p.normalized(local.dim()).dim;
    Tensor mine = Tensor::scalar(static_cast<double>(local.size(d)), DType::int64).reshape({1});
    Tensor all({comm.size()}, DType::int64);
    {
        CountingPaused pause(comm.counter().get());  // shape metadata, not the plan's traffic
        comm.all_gather(mine, all);
    }
    Shape g = local.shape();
    g[d] = 0;
    for (int r = 0; r < comm.size(); ++r) g[d] += static_cast<int64_t>(all.item(r));
    return g;
}

std::shared_ptr<ModuleHooks> make_style_hooks(const StyleSpec& spec, Module& module, std::shared_ptr<TpState> state) {
    if (spec.style == "sequence_parallel") return std::make_shared<SequenceParallelHooks>(std::move(state));
    if (auto* emb = dynamic_cast<Embedding*>(&module)) {
        if (spec.style == "colwise") return std::make_shared<ColwiseEmbeddingHooks>(spec, *emb, std::move(state));
        if (spec.style == "rowwise") return std::make_shared<RowwiseEmbeddingHooks>(spec, std::move(state));
    }
    if (spec.style == "colwise" || spec.style == "rowwise") {
        auto* lin = dynamic_cast<Linear*>(&module);
        PTOOL_REQUIRE(lin, "{} on a {} (checked when the plan was resolved)", spec.style, module.type());
        if (spec.style == "colwise") return std::make_shared<ColwiseHooks>(spec, *lin, std::move(state));
        return std::make_shared<RowwiseHooks>(spec, *lin, std::move(state));
    }
    return std::make_shared<PrepareHooks>(spec, std::move(state));
}

}  // namespace ptool
