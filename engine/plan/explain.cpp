#include "plan/explain.h"

#include <map>
#include <set>
#include <unordered_map>

#include "core/tensor_ops.h"
#include "model/routed_experts.h"
#include "parallel/grad_norm.h"

namespace ptool {
namespace {

// verify's record of one step on rank 0, every tensor full size: parameters, gradients, buffers,
// output, loss, and every module call's output and (for float inputs) input gradient.
int64_t record_bytes_per_step(const Model& model, const Plan& plan, const LayoutReport& layouts, int dp) {
    const int64_t es = static_cast<int64_t>(dtype_size(model.dtype));
    // module outputs and input gradients in the compute dtype (mixed precision's param_dtype)
    const int64_t ce = static_cast<int64_t>(dtype_size(plan.compute_dtype(model.dtype)));
    // a mixture of experts' experts report their output and input gradient at the layer's tokens
    // (its input's shape) and nothing from inside them (model/moe.h)
    std::map<std::string, int64_t> experts;
    for (const CallLayout& c : layouts.calls)
        if (const RoutedExperts* moe = c.module->routed_experts())
            for (int64_t e = 0; e < moe->experts(); ++e)
                experts[join_name(c.fqn, fmt::format("experts.{}", e))] = numel_of(c.in.global);
    auto inside_expert = [&](const std::string& fqn) {
        auto it = experts.upper_bound(fqn);
        if (it == experts.begin()) return false;
        --it;
        return fqn.size() > it->first.size() && fqn.compare(0, it->first.size(), it->first) == 0 &&
               fqn[it->first.size()] == '.';
    };
    int64_t events = 0;
    for (const CallLayout& c : layouts.calls) {
        if (c.module->transparent()) continue;                      // reports no events (an unnamed residual)
        if (const RoutedExperts* moe = c.module->routed_experts())  // its routing weights [.., experts]
            events += numel_of(c.in.global) / moe->token_dim() * moe->experts();
        if (auto it = experts.find(c.fqn); it != experts.end()) {
            events += 2 * it->second;
            continue;
        }
        if (inside_expert(c.fqn)) continue;
        events += numel_of(c.out.global);
        if (!c.module->takes_ids()) events += numel_of(c.in.global);
    }
    // the layout pass walks one microbatch of one dp rank's rows
    int64_t bytes =
        (events * ce + numel_of(layouts.output.global) * es) * dp * plan.accumulation_rounds(model) +
        es;                                    // the calls', the output, the loss
    if (model.clip_grad_norm > 0) bytes += 8;  // the gradients' norm (float64)
    for (const auto& [name, p] : model.named_parameters())
        bytes += 2 * static_cast<int64_t>(p->value.nbytes());
    for (const auto& [name, b] : model.named_buffers()) bytes += static_cast<int64_t>(b->value.nbytes());
    return bytes;
}

ModuleExplain explain_module(const ResolvedStyle& rs, const CallLayout& call, int tp) {
    ModuleExplain me;
    me.fqn = rs.fqn;
    me.pattern = rs.entry->pattern;
    me.style = std::string(rs.entry->style.name());
    me.input = call.in.global;
    me.output = call.out.global;
    for (const ParamPlacement& pp : rs.entry->style.style->params(*rs.module)) {
        ParamLayout pl;
        pl.fqn = join_name(rs.fqn, pp.param);
        pl.full = rs.module->param(pp.param)->value.shape();
        pl.placement = pp.placement;
        for (int r = 0; r < tp; ++r) pl.local.push_back(local_shape(pl.full, pl.placement, tp, r));
        me.params.push_back(pl);
    }
    return me;
}

}  // namespace

Explanation explain_plan(const Model& model, const Plan& plan, const Resolution* resolved) {
    Explanation ex;
    ex.resolution = resolved ? resolved->rebound(model, model) : resolve_plan(model, plan);
    ex.tp = ex.resolution.tp;
    ex.dp = ex.resolution.dp.size;
    const LayoutReport& layouts = ex.resolution.layouts;
    std::set<const Module*> explained;  // a shared module's first call
    for (const CallLayout& call : layouts.calls)
        if (call.style && explained.insert(call.module).second)
            ex.modules.push_back(explain_module(*call.style, call, ex.tp));
    // under expert parallelism a rank runs its own experts only, on the rows every ep rank sends
    // them (balanced: ep times its own): the others' tensor-parallel collectives are not its, its
    // own experts' carry ep times the rows (ep rank 0's experts stand for every rank's)
    std::map<std::string, bool> experts;  // an expert's module -> ep rank 0 owns it
    for (const auto& [name, owner] : ex.resolution.ep.owner)
        experts[name.substr(0, name.rfind('.'))] = owner == 0;
    auto own = [&](const std::vector<CommCost>& costs) {
        std::vector<CommCost> out;
        for (CommCost c : costs) {
            auto it = experts.find(c.module);
            if (it != experts.end() && !it->second) continue;
            if (it != experts.end()) c.bytes *= ex.resolution.ep.size;
            out.push_back(c);
        }
        return out;
    };
    const std::vector<CommCost> forward = own(layouts.forward), backward = own(layouts.backward);
    for (int64_t j = 0, n = plan.accumulation_rounds(model); j < n;
         ++j) {  // each microbatch's forward and backward
        ex.step_comm.insert(ex.step_comm.end(), forward.begin(), forward.end());
        ex.step_comm.insert(ex.step_comm.end(), backward.begin(), backward.end());
    }
    ex.record_step_bytes = record_bytes_per_step(model, plan, layouts, ex.dp);

    // memory per rank: parameters, gradients, optimizer state (SGD momentum 1x, AdamW 2x)
    std::map<const Parameter*, const ParamLayout*> distributed;
    std::unordered_map<std::string, const Parameter*>
        by_name;  // once: a lookup per styled parameter, not a walk of the model
    const auto params = model.named_parameters();
    for (const auto& [name, p] : params) by_name.emplace(name, p.get());
    for (const auto& me : ex.modules)
        for (const auto& pl : me.params)
            if (auto it = by_name.find(pl.fqn); it != by_name.end()) distributed[it->second] = &pl;
    auto tp_local = [&](const Parameter* p, int r) {
        auto it = distributed.find(p);
        return it == distributed.end() ? p->value.shape() : it->second->local[r];
    };
    if (ex.resolution.dp.active) explain_data_parallel(model, plan, ex, tp_local);
    explain_context_parallel(model, plan, ex, tp_local);
    explain_expert_parallel(model, plan, ex, tp_local);
    if (model.clip_grad_norm > 0) {
        std::vector<int> sizes;  // the dims that cut parameters, as clip_grad_norm reduces over them
        for (int d : plan.dims.param_nesting()) sizes.push_back(plan.mesh()[d].size);
        for (const auto& [op, bytes] : clip_grad_norm_cost(static_cast<int64_t>(params.size()), sizes))
            ex.step_comm.push_back({op, bytes, "(clip)", Phase::backward});
    }
    ex.step_comm.insert(ex.step_comm.end(), ex.zero_gathers.begin(), ex.zero_gathers.end());
    // global_tokens: the step's valid-target count (one float64) summed over the ranks whose
    // tokens differ, once before the first forward
    const int cp = plan.context_parallel ? plan.dims.size(DimRole::cp) : 1;
    if (plan.normalization(model) == LossNormalization::global_tokens && plan.dims.data_size() * cp > 1)
        ex.step_comm.insert(ex.step_comm.begin(), {Collective::all_reduce, 8, "(loss)", Phase::forward});
    return ex;
}

bool recomputed_in_backward(const Resolution& res, const std::string& fqn) {
    for (const auto* list : {&res.checkpointing.checkpointed, &res.checkpointing.selective})
        for (const Module* c : *list)
            if (c->fqn().empty() || fqn == c->fqn() || fqn.rfind(c->fqn() + ".", 0) == 0) return true;
    return false;
}

}  // namespace ptool
