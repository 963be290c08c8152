// rowwise: PyTorch's RowwiseParallel, Megatron's RowParallelLinear.
//   linear     weight Shard(1), bias Replicate; input input_layouts (Shard(-1)) -> Shard(-1);
//              computes Partial sums; output -> output_layouts (Replicate: all_reduce, Megatron's
//              g; Shard(d): reduce_scatter, sequence parallel). The bias is added once, after the
//              reduction (its piece of the output's last dim when that is sharded); its gradient,
//              summed over this rank's rows of dy, is reduced to Replicate.
//   embedding  vocab-parallel: weight Shard(0) (the vocabulary); each rank looks up the ids it
//              holds, zeros for the rest, so the output is Partial -> output_layouts (Replicate).
#include "core/tensor_ops.h"
#include "parallel/styles/sharding.h"

namespace ptool::styles {
namespace {

class RowwiseHooks final : public StyleHooks {
public:
    using StyleHooks::StyleHooks;

protected:
    Placed finish_forward(RunContext& ctx, Module& m, const Placed& y) override {
        const Tensor& bias = m.param("bias")->value;
        const Placement o = y.p.normalized(static_cast<int64_t>(y.global.size()));
        const bool last_sharded = o.is_shard() && o.dim == static_cast<int64_t>(y.global.size()) - 1;
        const Tensor b = last_sharded ? chunk(bias, tp().size(), tp().rank(), 0) : bias;
        Tensor out = y.t.clone();
        if (b.numel() > 0) {
            Tensor rows = out.reshape({out.numel() / b.numel(), b.numel()});
            ctx.backend->add_bias(rows, b);
        }
        return {out, y.p, y.global};
    }
    void start_backward(RunContext& ctx, Module&, const Placed& dy) override {
        const int64_t n = dy.t.size(-1);
        Tensor piece = Tensor::empty({n}, dy.t.dtype(), dy.t.device());
        ctx.backend->sum_rows(dy.t.reshape({n ? dy.t.numel() / n : 0, n}), piece, false);
        pieces_.push(ctx.microbatch, piece);
    }
    std::vector<Tensor> grad_pieces(RunContext& ctx, Module&) override {
        return {pieces_.pop(ctx.microbatch)};
    }

private:
    MicrobatchStack<Tensor> pieces_;  // per call: this call's bias gradient, as its rows of dy give it
};

class Rowwise final : public ShardingStyle {
public:
    std::string_view name() const override { return style_name::rowwise; }

    void check(const StyleCheck& c) const override {
        if (const Linear* lin = as_linear(c.module))
            check_sharded_weight(c, name(), lin->in_features(), "input features");
        else
            check_sharded_weight(c, name(), as_embedding(c.module)->vocab(), "vocabulary rows");
    }

    std::vector<ParamPlacement> params(const Module& m) const override {
        if (as_embedding(m)) return {{"weight", Placement::shard(0)}};
        std::vector<ParamPlacement> out = {{"weight", Placement::shard(1)}};
        if (m.param("bias")) out.push_back({"bias", Placement::replicate()});
        return out;
    }

    StyleRule rule(const Module& m, const StyleSpec& s) const override {
        StyleRule r;
        const Placement compute_in = as_embedding(m) ? Placement::replicate() : Placement::shard(-1);
        r.pre = Redistribution{s.input_layouts.value_or(compute_in), compute_in};
        r.compute_out = Placement::partial();
        r.post = Redistribution{Placement::partial(), s.output_layouts.value_or(Placement::replicate())};
        return r;
    }

    // The replicated bias's gradient is the sum of dy over rows: partial where dy's rows are split
    // or partial, this rank's piece where dy's last dim is sharded.
    std::vector<ParamGradSync> grad_syncs(const Module& m, const StyleSpec&,
                                          const Layout& out) const override {
        if (as_embedding(m) || !m.param("bias")) return {};
        const int64_t nd = static_cast<int64_t>(out.global.size());
        const Placement g = grad_placement(out.p).normalized(nd);
        if (g.is_replicate()) return {{"bias", Placement::replicate()}};
        if (g.is_shard() && g.dim == nd - 1) return {{"bias", Placement::shard(0)}};
        return {{"bias", Placement::partial()}};
    }

    std::shared_ptr<ModuleHooks> install(Module& m, const StyleSpec& s, Communicator& tp) const override {
        if (auto* emb = dynamic_cast<Embedding*>(&m)) {
            emb->set_vocab_offset(chunk_of(emb->vocab(), tp.size(), tp.rank()).offset);
            return Style::install(m, s, tp);
        }
        if (!m.param("bias")) return Style::install(m, s, tp);
        static_cast<Linear&>(m).set_defer_bias(true);  // the hooks add it after the reduction
        return std::make_shared<RowwiseHooks>(m, s, tp);
    }
};

PTOOL_REGISTER_STYLE(Rowwise);

}  // namespace
}  // namespace ptool::styles
