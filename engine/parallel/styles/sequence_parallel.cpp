// sequence_parallel: PyTorch's SequenceParallel (Megatron-SP, Korthikanti et al.) on layer_norm,
// rms_norm and dropout. The activation stays Shard(1) (the sequence); the module runs on its local
// rows; its replicated parameters' gradients, each a sum over this rank's rows only, are reduced
// (all_reduce) after every call's backward.
#include "parallel/style.h"

namespace ptool::styles {
namespace {

class SequenceParallelHooks final : public StyleHooks {
public:
    using StyleHooks::StyleHooks;

protected:
    void start_backward(RunContext& ctx, Module& m, const Placed&) override {
        // this call's contribution is what its backward adds to the grads: taken where that adds
        // them (a split backward's W, after other microbatches' Ws may have added theirs)
        Module::defer_weights(ctx, [this, &m](RunContext& c) {
            std::vector<Tensor> before;
            for (const auto& e : m.params()) before.push_back(e.param->grad.clone());
            before_.push(c.microbatch, std::move(before));
        });
    }
    std::vector<Tensor> grad_pieces(RunContext& ctx, Module& m) override {
        std::vector<Tensor> before = before_.pop(ctx.microbatch), pieces;
        for (size_t i = 0; i < m.params().size(); ++i) {
            Tensor& g = m.params()[i].param->grad;
            Tensor delta = g.clone();
            ctx.backend->axpy(-1.0, before[i], delta);
            ctx.backend->copy(before[i], g);  // the reduced contribution is added back
            pieces.push_back(delta);
        }
        return pieces;
    }

private:
    MicrobatchStack<std::vector<Tensor>> before_;
};

class SequenceParallel final : public Style {
public:
    std::string_view name() const override { return style_name::sequence_parallel; }
    bool applies_to(const Module& m) const override {
        return dynamic_cast<const Norm*>(&m) || dynamic_cast<const Dropout*>(&m);
    }
    std::string_view applies_to_text() const override { return "layer_norm, rms_norm and dropout"; }
    void parse(YamlMap& m, const YamlNode&,
               StyleSpec& s) const override {  // SequenceParallel(sequence_dim=1)
        s.use_local_output = m.bool_or("use_local_output", true);
    }
    StyleRule rule(const Module&, const StyleSpec&) const override {
        StyleRule r;
        r.pre =
            Redistribution{Placement::shard(1), Placement::shard(1)};  // what it expects, no communication
        return r;
    }
    std::vector<ParamGradSync> grad_syncs(const Module& m, const StyleSpec&, const Layout&) const override {
        std::vector<ParamGradSync> out;
        for (const auto& e : m.params()) out.push_back({e.name, Placement::partial()});
        return out;
    }
    std::shared_ptr<ModuleHooks> install(Module& m, const StyleSpec& s, Communicator& tp) const override {
        if (m.params().empty()) return Style::install(m, s, tp);
        return std::make_shared<SequenceParallelHooks>(m, s, tp);
    }
};

PTOOL_REGISTER_STYLE(SequenceParallel);

}  // namespace
}  // namespace ptool::styles
