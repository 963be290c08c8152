#include "parallel/style.h"

#include <map>

#include "parallel/redistribute.h"

namespace ptool {
namespace {

std::map<std::string, std::unique_ptr<Style>, std::less<>>& registry() {
    static std::map<std::string, std::unique_ptr<Style>, std::less<>> styles;
    return styles;
}

}  // namespace

std::string_view StyleSpec::name() const {
    return style ? style->name() : std::string_view();
}

const Style* find_style(std::string_view name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : it->second.get();
}

std::vector<std::string> style_names() {
    std::vector<std::string> out;
    for (const auto& [name, s] : registry()) out.push_back(name);
    return out;
}

bool register_style(std::unique_ptr<Style> style) {
    const std::string name(style->name());
    PTOOL_REQUIRE(!registry().count(name), "style '{}' registered twice", name);
    registry().emplace(name, std::move(style));
    return true;
}

std::optional<Placement> parse_layout_key(YamlMap& m, const char* key) {
    auto v = m.get(key);
    if (!v) return std::nullopt;
    Placement p;
    const std::string text = v->as_string(fmt::format("'{}'", key));
    if (!parse_placement(text, &p))
        v->fail(fmt::format("'{}: {}' is not a layout (valid: replicate, shard(d), partial)", key, text));
    return p;
}

std::shared_ptr<ModuleHooks> Style::install(Module& m, const StyleSpec& s, Communicator& tp) const {
    return std::make_shared<StyleHooks>(m, s, tp);
}

StyleHooks::StyleHooks(const Module& m, const StyleSpec& s, Communicator& tp)
    : spec_(s), rule_(s.style->rule(m, s)), tp_(tp) {}

// The incoming tensor's own placement is the source of every redistribution: the lint has checked
// it is the one the rule declares (a fault layer may relabel it on purpose).
Placed StyleHooks::pre_forward(RunContext&, Module&, const Placed& x) {
    if (!rule_.pre) return x;
    Placed in = redistribute(x, rule_.pre->to, tp_);
    if (spec_.save_input_shard) shard_ = x, gathered_ = in;
    return in;
}

// Megatron's ColumnParallelLinear under sequence parallelism saves its input shard and all-gathers
// it again in backward; any view of the whole gathered input (the linear's [rows, in]) is so kept.
std::function<Tensor()> StyleHooks::pack_saved(const Tensor& t) {
    if (!gathered_.defined() || !t.shares_storage(gathered_.t) || t.numel() != gathered_.t.numel()) return {};
    return [shard = shard_, to = rule_.pre->to, shape = t.shape(), &tp = tp_] {
        return redistribute(shard, to, tp).t.reshape(shape);
    };
}

Placed StyleHooks::post_forward(RunContext& ctx, Module& m, const Placed& y) {
    shard_ = gathered_ = Placed{};  // the forward is done: nothing more is saved
    const Placed out = finish_forward(ctx, m, rule_.post ? redistribute(y, rule_.post->to, tp_) : y);
    if (ctx.recording) outputs_.push(ctx.microbatch, out.layout());  // a checkpointed forward keeps nothing
    return out;
}

Placed StyleHooks::post_forward_backward(RunContext& ctx, Module& m, const Placed& dy) {
    start_backward(ctx, m, dy);
    return rule_.post ? redistribute(dy, grad_placement(rule_.post->from), tp_) : dy;
}

Placed StyleHooks::pre_forward_backward(RunContext&, Module&, const Placed& dx) {
    return rule_.pre ? redistribute(dx, grad_placement(rule_.pre->from), tp_) : dx;
}

void StyleHooks::post_backward(RunContext& ctx, Module& m) {
    const Layout out = outputs_.pop(ctx.microbatch);
    const std::vector<ParamGradSync> syncs = spec_.style->grad_syncs(m, spec_, out);
    if (syncs.empty()) return;
    const std::vector<Tensor> pieces = grad_pieces(ctx, m);
    PTOOL_REQUIRE(pieces.size() == syncs.size(), "style '{}' gave {} gradient pieces for {} syncs",
                  spec_.name(), pieces.size(), syncs.size());
    for (size_t i = 0; i < syncs.size(); ++i) {
        Tensor& grad = m.param(syncs[i].param)->grad;
        ctx.backend->axpy(
            1.0, redistribute(pieces[i], syncs[i].from, Placement::replicate(), grad.shape(), tp_), grad);
    }
}

}  // namespace ptool
