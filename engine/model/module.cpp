#include "model/module.h"

#include <set>

namespace ptool {

Tensor Module::forward(RunContext& ctx, const Tensor& x) {
    Tensor y = hooks_ ? hooks_->post_forward(ctx, *this, forward_impl(ctx, hooks_->pre_forward(ctx, *this, x)))
                      : forward_impl(ctx, x);
    if (ctx.observer) ctx.observer(*this, "forward", y);
    return y;
}

Tensor Module::backward(RunContext& ctx, const Tensor& dy) {
    Tensor dx = hooks_ ? backward_impl(ctx, hooks_->post_forward_backward(ctx, *this, dy)) : backward_impl(ctx, dy);
    if (hooks_ && dx.defined()) dx = hooks_->pre_forward_backward(ctx, *this, dx);
    if (hooks_) hooks_->post_backward(ctx, *this);
    if (ctx.observer && dx.defined()) ctx.observer(*this, "backward", dx);
    return dx;
}

namespace {

class ChainedHooks : public ModuleHooks {
public:
    ChainedHooks(std::shared_ptr<ModuleHooks> outer, std::shared_ptr<ModuleHooks> inner)
        : outer_(std::move(outer)), inner_(std::move(inner)) {}
    Tensor pre_forward(RunContext& c, Module& m, const Tensor& x) override {
        return inner_->pre_forward(c, m, outer_->pre_forward(c, m, x));
    }
    Tensor post_forward(RunContext& c, Module& m, const Tensor& y) override {
        return outer_->post_forward(c, m, inner_->post_forward(c, m, y));
    }
    Tensor post_forward_backward(RunContext& c, Module& m, const Tensor& dy) override {
        return inner_->post_forward_backward(c, m, outer_->post_forward_backward(c, m, dy));
    }
    Tensor pre_forward_backward(RunContext& c, Module& m, const Tensor& dx) override {
        return outer_->pre_forward_backward(c, m, inner_->pre_forward_backward(c, m, dx));
    }
    void post_backward(RunContext& c, Module& m) override {
        inner_->post_backward(c, m);
        outer_->post_backward(c, m);
    }

private:
    std::shared_ptr<ModuleHooks> outer_, inner_;
};

}  // namespace

void Module::add_outer_hooks(std::shared_ptr<ModuleHooks> outer) {
    hooks_ = hooks_ ? std::make_shared<ChainedHooks>(std::move(outer), std::move(hooks_)) : std::move(outer);
}

std::vector<Tensor> Module::restore() {
    PTOOL_REQUIRE(!saved_.empty(), "backward of '{}' without a forward", fqn_);
    std::vector<Tensor> t = std::move(saved_.back());
    saved_.pop_back();
    return t;
}

ParamPtr Module::param(const std::string& name) const {
    for (const auto& e : params_)
        if (e.name == name) return e.param;
    return nullptr;
}

std::string join_name(const std::string& prefix, const std::string& name) {
    if (prefix.empty()) return name;
    if (name.empty()) return prefix;
    return prefix + "." + name;
}

static void walk_params(const Module& m, const std::string& prefix,
                        const std::function<void(const std::string&, const ParamPtr&)>& fn, bool buffers) {
    for (const auto& e : buffers ? m.buffers() : m.params()) fn(join_name(prefix, e.name), e.param);
    for (const auto& [name, child] : m.children()) walk_params(*child, join_name(prefix, name), fn, buffers);
}

void for_each_param(const Module& root, const std::function<void(const std::string&, const ParamPtr&)>& fn,
                    bool buffers) {
    walk_params(root, "", fn, buffers);
}

static void walk_modules(Module& m, const std::string& prefix, std::set<const Module*>& seen,
                         const std::function<void(const std::string&, Module&)>& fn) {
    if (!seen.insert(&m).second) return;
    fn(prefix, m);
    for (const auto& [name, child] : m.children()) walk_modules(*child, join_name(prefix, name), seen, fn);
}

void for_each_module(const Module& root, const std::function<void(const std::string&, Module&)>& fn) {
    std::set<const Module*> seen;
    walk_modules(const_cast<Module&>(root), "", seen, fn);
}

// Uninitialised: init_params (or a state_dict, or a rank's shard init) writes every element, and
// gradients are zeroed at the start of every step. Untouched pages cost nothing, which matters
// for rank models that keep only a shard of each parameter.
ParamPtr make_param(Shape shape, DType dtype) {
    auto p = std::make_shared<Parameter>();
    p->value = Tensor::empty(shape, dtype);
    p->grad = Tensor::empty(shape, dtype);
    return p;
}

ParamPtr make_buffer(Shape shape, DType dtype) {
    auto p = std::make_shared<Parameter>();
    p->value = Tensor::empty(std::move(shape), dtype);
    return p;
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

}  // namespace ptool
