// gated_mlp, the containers sequential, repeat and residual, and `shared` (an earlier module
// under a second name: no class of its own).
#include "model/blocks.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// gated_mlp: dim, hidden, activation (silu), bias (false, as Llama).
class GatedMlpType final : public ModuleType {
public:
    GatedMlpType() : ModuleType("gated_mlp", 140) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        YamlMap& m = e.keys;
        const int64_t dim = e.positive("dim"), hidden = e.positive("hidden");
        const Activation act = activation(m, "activation", "silu");
        const bool bias = m.bool_or("bias", false);
        const YamlNode at =
            m.at("hidden");  // gate_proj and up_proj [hidden, dim], down_proj [dim, hidden], their biases
        b.account(at, size_add(at, size_mul(at, 3, size_mul(at, dim, hidden)),
                               bias ? size_add(at, 2 * hidden, dim) : 0));
        return std::make_shared<GatedMlp>(e.name, e.where, dim, hidden, act, bias, b.dtype());
    }
    TpTemplate tp_template() const override {
        return {.rule = TpRule::projections, .colwise = ".[gu]*_proj", .rowwise = ".down_proj"};
    }
    ShrinkKeys shrink_keys() const override { return {.sizes = {"dim", "hidden"}}; }

private:
    static Activation activation(YamlMap& m, const std::string& key, const std::string& fallback) {
        const std::string a = m.string_or(key, fallback);
        if (a == "silu") return Activation::silu;
        if (a == "relu") return Activation::relu;
        if (a == "gelu") return Activation::gelu;
        if (a == "tanh") return Activation::tanh;
        m.at(key).fail(fmt::format("unknown activation '{}' (valid: silu, relu, gelu, tanh)", a));
    }
};

// sequential and residual: modules. Without a name, transparent (docs/model_format.md).
template <class Container>
class ContainerType final : public ModuleType {
public:
    ContainerType(std::string name, int listed, TpRule rule)
        : ModuleType(std::move(name), listed), rule_(rule) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        auto c = std::make_shared<Container>(e.name, e.where);
        b.children(e.keys, *c, e.fqn);
        return c;
    }
    bool transparent_without_name() const override { return true; }
    TpTemplate tp_template() const override { return {.rule = rule_}; }

private:
    TpRule rule_;
};

// repeat: count (at most 4096), modules: blocks "0".."count-1", each a sequential of the modules.
class RepeatType final : public ModuleType {
public:
    RepeatType() : ModuleType("repeat", 160) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        const int64_t count = e.positive("count");
        if (count > 4096) e.keys.at("count").fail("repeat count over 4096");
        auto list = std::make_shared<Repeat>(e.name, e.where);
        for (int64_t i = 0; i < count; ++i) {  // each copy's modules account for themselves
            auto copy = std::make_shared<Sequential>(std::to_string(i), e.where);
            const std::string cfqn = join_name(e.fqn, std::to_string(i));
            copy->set_fqn(cfqn);
            b.children(e.keys, *copy, cfqn);
            b.name_module(cfqn, copy);
            list->add_child(std::to_string(i), copy);
        }
        return list;
    }
    TpTemplate tp_template() const override { return {.rule = TpRule::repeat}; }
    ShrinkKeys shrink_keys() const override { return {.count = "count"}; }
};

// shared: module (an earlier module's FQN), registered again under this entry's name.
class SharedType final : public ModuleType {
public:
    SharedType() : ModuleType("shared", 180) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        YamlNode target = e.keys.at("module");
        return b.lookup(target, target.as_string("'module'"), "module");
    }
    bool aliases() const override { return true; }
    // Never asked: the module it builds is the earlier one, which has its own type.
    TpTemplate tp_template() const override { return {.rule = TpRule::none}; }
};

const GatedMlpType gated_mlp_type;
const ContainerType<Sequential> sequential_type("sequential", 150, TpRule::sequence);
const ContainerType<Residual> residual_type("residual", 170, TpRule::residual);
const RepeatType repeat_type;
const SharedType shared_type;
PTOOL_REGISTER_MODULE_TYPE(gated_mlp_type);
PTOOL_REGISTER_MODULE_TYPE(sequential_type);
PTOOL_REGISTER_MODULE_TYPE(repeat_type);
PTOOL_REGISTER_MODULE_TYPE(residual_type);
PTOOL_REGISTER_MODULE_TYPE(shared_type);

}  // namespace

Sequential::Sequential(std::string name, SourceLocation where)
    : Module(sequential_type, std::move(name), std::move(where)) {}

Repeat::Repeat(std::string name, SourceLocation where)
    : Sequential(repeat_type, std::move(name), std::move(where)) {}

Residual::Residual(std::string name, SourceLocation where)
    : Sequential(residual_type, std::move(name), std::move(where)) {}

GatedMlp::GatedMlp(std::string name, SourceLocation where, int64_t dim, int64_t hidden, Activation act,
                   bool bias, DType dtype)
    : Module(gated_mlp_type, std::move(name), std::move(where)), act_(act) {
    add_child("gate_proj", std::make_shared<Linear>("gate_proj", this->where(), dim, hidden, bias, dtype));
    add_child("up_proj", std::make_shared<Linear>("up_proj", this->where(), dim, hidden, bias, dtype));
    add_child("down_proj", std::make_shared<Linear>("down_proj", this->where(), hidden, dim, bias, dtype));
}

Shape GatedMlp::output_shape(const Shape& in) const {
    return child(2).output_shape(child(0).output_shape(in));
}

Layout GatedMlp::layout(LayoutVisitor& v, const Layout& in) const {
    const Layout g = v.call(child(0), in), u = v.call(child(1), in);
    if (!g.same_as(u))
        conflict(
            fmt::format("gated_mlp '{}' multiplies gate_proj's output ({}) by up_proj's ({}): they need one "
                        "placement (style gate_proj and up_proj alike)",
                        fqn(), g.str(), u.str()));
    if (g.p.is_partial())
        conflict(fmt::format(
            "gated_mlp '{}' applies its activation to partial sums from gate_proj: reduce them first",
            fqn()));
    return v.call(child(2), g);
}

Placed GatedMlp::forward_placed(RunContext& ctx, const Placed& x) {
    Backend& be = *ctx.backend;
    const Placed g = child(0).forward(ctx, x);  // [.., hidden]
    const Placed u = child(1).forward(ctx, x);
    Tensor a = empty_like(g.t), h = empty_like(g.t);
    be.gated_activation(act_, g.t, u.t, a, h);  // activation then mul, in one pass
    save({g.t, a, u.t});
    return child(2).forward(ctx, {h, g.p, g.global});
}

Placed GatedMlp::backward_placed(RunContext& ctx, const Placed& dy, const Layout&) {
    Backend& be = *ctx.backend;
    std::vector<Tensor> s = restore();
    const Tensor &g = s[0], &a = s[1], &u = s[2];
    const Placed dh = child(2).backward(ctx, dy);
    Tensor du = empty_like(dh.t), dg = empty_like(dh.t);
    be.gated_activation_backward(act_, g, a, u, dh.t, du, dg);  // mul, mul, activation_backward in one pass
    const Placed dx_up = child(1).backward(ctx, {du, dh.p, dh.global});
    const Placed dx_gate = child(0).backward(ctx, {dg, dh.p, dh.global});
    Tensor dx = empty_like(dx_up.t);
    be.add(dx_up.t, dx_gate.t, dx);
    return {dx, dx_up.p, dx_up.global};
}

Shape Sequential::output_shape(const Shape& in) const {
    Shape s = in;
    for (const auto& [name, child] : children()) s = child->output_shape(s);
    return s;
}

Layout Sequential::layout(LayoutVisitor& v, const Layout& in) const {
    Layout h = in;
    for (const auto& [name, child] : children()) h = v.call(*child, h);
    return h;
}

bool Sequential::takes_ids() const {
    return !children().empty() && children()[0].second->takes_ids();
}

Placed Sequential::forward_placed(RunContext& ctx, const Placed& x) {
    Placed h = x;
    for (const auto& [name, child] : children()) h = child->forward(ctx, h);
    return h;
}

Placed Sequential::backward_placed(RunContext& ctx, const Placed& dy, const Layout&) {
    Placed d = dy;
    for (auto it = children().rbegin(); it != children().rend(); ++it) d = it->second->backward(ctx, d);
    return d;
}

Shape Residual::output_shape(const Shape& in) const {
    Shape out = Sequential::output_shape(in);
    if (out != in)
        fail(fmt::format("residual '{}' body maps {} to {}: y = x + body(x) needs the same shape", fqn(),
                         shape_str(in), shape_str(out)));
    return out;
}

Layout Residual::layout(LayoutVisitor& v, const Layout& in) const {
    const Layout body = Sequential::layout(v, in);
    if (!body.same_as(in))
        conflict(fmt::format(
            "residual '{}' adds its input ({}) to its body's output ({}): they need one placement", fqn(),
            in.str(), body.str()));
    return in;
}

Placed Residual::forward_placed(RunContext& ctx, const Placed& x) {
    const Placed body = Sequential::forward_placed(ctx, x);
    PTOOL_REQUIRE(body.t.shape() == x.t.shape(),
                  "residual '{}': body {} vs input {} (the lint checks layouts)", fqn(),
                  shape_str(body.t.shape()), shape_str(x.t.shape()));
    Tensor y = empty_like(x.t);
    ctx.backend->add(x.t, body.t, y);
    return {y, x.p, x.global};
}

Placed Residual::backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) {
    const Placed dbody = Sequential::backward_placed(ctx, dy, in);
    Tensor dx = empty_like(dy.t);
    ctx.backend->add(dy.t, dbody.t, dx);
    return {dx, dy.p, dy.global};
}

}  // namespace ptool
