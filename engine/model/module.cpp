#include "model/module.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "backend/meta/meta_backend.h"
#include "core/framework_memory.h"
#include "core/memory_account.h"
#include "core/turns.h"
#include "model/module_type.h"

namespace ptool {

const char* phase_name(Phase p) {
    return p == Phase::forward ? "forward" : "backward";
}

const std::string& Module::type() const {
    return type_->name();
}

Placed Module::forward(RunContext& ctx, const Placed& x) {
    if (checkpointed_ && ctx.recording) {  // keep the input only: nothing below saves for backward
        SelectiveRegion region{0,
                               next_selective_call()};  // the op policy's pass: its outputs kept, not saved
        checkpoint_inputs_.push(ctx.microbatch, {x, region.call});
        SelectiveRegion* const outer = ctx.selective;
        ctx.recording = false, ctx.selective = selective_ ? &region : nullptr;
        Placed y = forward_hooked(ctx, x);
        ctx.recording = true, ctx.selective = outer;
        return y;
    }
    return forward_hooked(ctx, x);
}

Placed Module::forward_hooked(RunContext& ctx, const Placed& x) {
    take_turn();  // rank threads sharing cores advance together (core/turns.h)
    MemoryPhaseScope phase(fqn_, ctx.recomputing ? 'r' : 'f');
    const Placed in = hooks_ ? hooks_->pre_forward(ctx, *this, x) : x;
    saving_ = ctx.recording;
    microbatch_ = ctx.microbatch;
    if (ctx.recording) inputs_.push(ctx.microbatch, in.layout());
    const std::optional<Placement> computed = hooks_ ? hooks_->compute_out(*this) : std::nullopt;
    Placed y = computed ? Placed{forward_impl(ctx, in.t), *computed, output_shape(in.global)}
                        : forward_placed(ctx, in);
    if (hooks_) y = hooks_->post_forward(ctx, *this, y);
    if (ctx.observer && !transparent_) ctx.observer(fqn_, Phase::forward, ctx.microbatch, y);
    return y;
}

Placed Module::backward(RunContext& ctx, const Placed& dy) {
    if (checkpointed_) {  // recompute the forward, recording, unobserved, then run the backward it saved for
        PTOOL_REQUIRE(!checkpoint_inputs_.empty(ctx.microbatch),
                      "backward of checkpointed '{}' without a forward", fqn_);
        const CheckpointedCall call = checkpoint_inputs_.pop(ctx.microbatch);
        const Placed& x = call.input;
        auto observer = std::move(ctx.observer);
        const bool was = ctx.recomputing;
        // the op policy's count restarts: the forward's decisions, in order, taking what it kept
        SelectiveRegion region{0, call.selective_call};
        SelectiveRegion* const outer = ctx.selective;
        ctx.observer = nullptr, ctx.recomputing = true, ctx.selective = selective_ ? &region : nullptr;
        const bool meta_was = meta_work().recomputing;  // the meta backend counts the recompute's FLOPs apart
        meta_work().recomputing = true;
        forward_hooked(ctx, x);
        meta_work().recomputing = meta_was;
        ctx.observer = std::move(observer), ctx.recomputing = was, ctx.selective = outer;
    }
    take_turn();
    MemoryPhaseScope phase(fqn_, 'b');
    PTOOL_REQUIRE(!inputs_.empty(ctx.microbatch), "backward of '{}' without a forward", fqn_);
    const Layout in = inputs_.pop(ctx.microbatch);
    microbatch_ = ctx.microbatch;
    const Placed d = hooks_ ? hooks_->post_forward_backward(ctx, *this, dy) : dy;
    const std::optional<Placement> computed = hooks_ ? hooks_->compute_grad_in(*this) : std::nullopt;
    Placed dx;
    if (!computed)
        dx = backward_placed(ctx, d, in);
    else if (Tensor t = backward_impl(ctx, d.t); t.defined())
        dx = {t, *computed, in.global};
    if (hooks_ && dx.defined()) dx = hooks_->pre_forward_backward(ctx, *this, dx);
    if (!ctx.torch_release_after_first_backward.empty() && children().empty()) {
        for (const Tensor& t : ctx.torch_release_after_first_backward) torch_release(t);
        ctx.torch_release_after_first_backward.clear();
    }
    if (hooks_) defer_weights(ctx, [this](RunContext& c) { hooks_->post_backward(c, *this); });
    if (ctx.observer && dx.defined() && !transparent_)
        ctx.observer(fqn_, Phase::backward, ctx.microbatch, dx);
    return dx;
}

void Module::defer_weights(RunContext& ctx, std::function<void(RunContext&)> work,
                           std::vector<Tensor> reads) {
    if (!ctx.weight_work) return work(ctx);
    ctx.weight_work->work.push_back(std::move(work));
    for (Tensor& t : reads)
        if (t.defined()) ctx.weight_work->reads.push_back(std::move(t));
}

void run_weight_work(RunContext& ctx, WeightWork& work) {
    std::vector<std::function<void(RunContext&)>> run = std::move(work.work);
    work = WeightWork{};
    WeightWork* const outer = ctx.weight_work;
    ctx.weight_work = nullptr;  // what it runs computes now
    for (auto& w : run) w(ctx);
    ctx.weight_work = outer;
}

void Module::save(std::vector<Tensor> tensors) {
    if (!saving_) return;
    std::vector<Saved> kept;
    kept.reserve(tensors.size());
    for (Tensor& t : tensors) {
        std::function<Tensor()> unpack = hooks_ ? hooks_->pack_saved(t) : nullptr;
        kept.push_back(unpack ? Saved{Tensor(), std::move(unpack)} : Saved{std::move(t), nullptr});
    }
    saved_.push(microbatch_, std::move(kept));
}

std::vector<Tensor> Module::restore() {
    std::vector<Tensor> out;
    for (Saved& s : saved_.pop(microbatch_)) out.push_back(s.unpack ? s.unpack() : std::move(s.tensor));
    return out;
}

Placed Module::forward_placed(RunContext& ctx, const Placed& x) {
    return {forward_impl(ctx, x.t), out_placement(x.layout()), output_shape(x.global)};
}

Placed Module::backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) {
    Tensor dx = backward_impl(ctx, dy.t);
    if (!dx.defined()) return {};  // ids have no gradient
    return {dx, grad_placement(in.p), in.global};
}

Tensor Module::forward_impl(RunContext&, const Tensor&) {
    PTOOL_REQUIRE(false, "'{}' ({}) computes on placed tensors only", fqn_, type());
    return {};
}

Tensor Module::backward_impl(RunContext&, const Tensor&) {
    PTOOL_REQUIRE(false, "'{}' ({}) computes on placed tensors only", fqn_, type());
    return {};
}

Layout Module::layout(LayoutVisitor&, const Layout& in) const {
    return {output_shape(in.global), out_placement(in)};
}

void Module::init_shard(uint64_t, const std::string& param, Tensor&, int64_t, int64_t) const {
    PTOOL_REQUIRE(false, "'{}' ({}) cannot initialise a shard of '{}'", fqn_, type(), param);
}

void Module::conflict(const std::string& message) const {
    throw LayoutError(where_, message);
}

namespace {

class ChainedHooks : public ModuleHooks {
public:
    ChainedHooks(std::shared_ptr<ModuleHooks> outer, std::shared_ptr<ModuleHooks> inner)
        : outer_(std::move(outer)), inner_(std::move(inner)) {}
    Placed pre_forward(RunContext& c, Module& m, const Placed& x) override {
        return inner_->pre_forward(c, m, outer_->pre_forward(c, m, x));
    }
    Placed post_forward(RunContext& c, Module& m, const Placed& y) override {
        return outer_->post_forward(c, m, inner_->post_forward(c, m, y));
    }
    Placed post_forward_backward(RunContext& c, Module& m, const Placed& dy) override {
        return inner_->post_forward_backward(c, m, outer_->post_forward_backward(c, m, dy));
    }
    Placed pre_forward_backward(RunContext& c, Module& m, const Placed& dx) override {
        return outer_->pre_forward_backward(c, m, inner_->pre_forward_backward(c, m, dx));
    }
    void post_backward(RunContext& c, Module& m) override {
        inner_->post_backward(c, m);
        outer_->post_backward(c, m);
    }
    std::optional<Placement> compute_out(const Module& m) const override {
        auto p = inner_->compute_out(m);
        return p ? p : outer_->compute_out(m);
    }
    std::optional<Placement> compute_grad_in(const Module& m) const override {
        auto p = inner_->compute_grad_in(m);
        return p ? p : outer_->compute_grad_in(m);
    }
    std::function<Tensor()> pack_saved(const Tensor& t) override {
        auto u = inner_->pack_saved(t);
        return u ? u : outer_->pack_saved(t);
    }

private:
    std::shared_ptr<ModuleHooks> outer_, inner_;
};

}  // namespace

void Module::add_outer_hooks(std::shared_ptr<ModuleHooks> outer) {
    hooks_ = hooks_ ? std::make_shared<ChainedHooks>(std::move(outer), std::move(hooks_)) : std::move(outer);
}

void Module::keep_children(const std::function<bool(Module&)>& keep) {
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> kept;
    for (auto& c : children_)
        if (keep(*c.second)) kept.push_back(std::move(c));
    children_ = std::move(kept);
}

ParamPtr Module::param(const std::string& name) const {
    for (const auto& e : params_)
        if (e.name == name) return e.param;
    return nullptr;
}

std::string join_name(const std::string& prefix, const std::string& name) {
    if (prefix.empty()) return name;
    if (name.empty()) return prefix;
    std::string out;
    out.reserve(prefix.size() + 1 + name.size());
    return out.append(prefix).append(1, '.').append(name);
}

// `path` + "." + name in place (join_name's rule: an empty side adds no dot); returns the old length
// to cut back to. The walks below keep one path string for the whole tree instead of a new prefix
// per module and a new name per parameter (perf: a quarter of the planner's name building).
static size_t push_name(std::string& path, const std::string& name) {
    const size_t len = path.size();
    if (!path.empty() && !name.empty()) path += '.';
    path += name;
    return len;
}

static void walk_params(const Module& m, std::string& path,
                        const std::function<void(const std::string&, const ParamPtr&)>& fn, bool buffers) {
    for (const auto& e : buffers ? m.buffers() : m.params()) {
        const size_t len = push_name(path, e.name);
        fn(path, e.param);
        path.resize(len);
    }
    for (const auto& [name, child] : m.children()) {
        const size_t len = push_name(path, name);
        walk_params(*child, path, fn, buffers);
        path.resize(len);
    }
}

void for_each_param(const Module& root, const std::function<void(const std::string&, const ParamPtr&)>& fn,
                    bool buffers) {
    std::string path;
    walk_params(root, path, fn, buffers);
}

static void walk_modules(Module& m, std::string& path, std::unordered_set<const Module*>& seen,
                         const std::function<void(const std::string&, Module&)>& fn) {
    if (!seen.insert(&m).second) return;
    if (!m.transparent()) fn(path, m);
    for (const auto& [name, child] : m.children()) {
        const size_t len = push_name(path, name);
        walk_modules(*child, path, seen, fn);
        path.resize(len);
    }
}

void for_each_module(const Module& root, const std::function<void(const std::string&, Module&)>& fn) {
    std::unordered_set<const Module*> seen;
    std::string path;
    walk_modules(const_cast<Module&>(root), path, seen, fn);
}

namespace {

// (each module's count once: a shared module's call sites nested in shared ones multiply, and a
// walk of every path took 2^40 steps for 40 levels of two aliases; saturated at 2^62)
int64_t modules_under(const Module& m, std::unordered_map<const Module*, int64_t>& memo) {
    if (auto it = memo.find(&m); it != memo.end()) return it->second;
    int64_t n = 1;
    for (const auto& [name, child] : m.children())
        n = std::min(n + modules_under(*child, memo), int64_t{1} << 62);
    return memo[&m] = n;
}

}  // namespace

int64_t modules_under(const Module& root) {
    std::unordered_map<const Module*, int64_t> memo;
    return modules_under(root, memo);
}

std::vector<std::pair<std::string, Module*>> named_modules(const Module& root) {
    std::vector<std::pair<std::string, Module*>> out;
    for_each_module(root, [&](const std::string& fqn, Module& m) { out.emplace_back(fqn, &m); });
    return out;
}

// Uninitialised: init_params (or a state_dict, or a rank's shard init) writes every element, and
// gradients are zeroed at the start of every step. Untouched pages cost nothing, which matters
// for rank models that keep only a shard of each parameter.
ParamPtr make_param(Shape shape, DType dtype) {
    auto p = std::make_shared<Parameter>();
    {
        MemoryUseScope use(MemoryUse::parameters);
        p->value = Tensor::empty(shape, dtype);
    }
    MemoryUseScope use(MemoryUse::gradients);
    p->grad = Tensor::empty(shape, dtype);
    return p;
}

ParamPtr make_buffer(Shape shape, DType dtype) {
    auto p = std::make_shared<Parameter>();
    MemoryUseScope use(MemoryUse::parameters);
    p->value = Tensor::empty(std::move(shape), dtype);
    return p;
}

Tensor empty_like(const Tensor& t) {
    return Tensor::empty(t.shape(), t.dtype(), t.device());
}

}  // namespace ptool
