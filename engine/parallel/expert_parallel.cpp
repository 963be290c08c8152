#include "parallel/expert_parallel.h"

#include <algorithm>

#include "comm/comm_stats.h"
#include "model/routed_experts.h"

namespace ptool {

ExpertParallelResolution resolve_expert_parallel(const Model& model, const Plan& plan, bool whole_model) {
    ExpertParallelResolution res;
    if (!plan.expert_parallel) return res;
    const SourceLocation& at = plan.expert_parallel->where;
    res.active = true;
    res.size = plan.dims.size(DimRole::ep);
    res.grad_reduce = plan.gradient_reduction(model);
    std::map<const Parameter*, std::string> names;
    for (const auto& [name, p] : model.named_parameters()) names.emplace(p.get(), name);
    for (const auto& [fqn, m] : named_modules(*model.root)) {
        const RoutedExperts* moe = m->routed_experts();
        if (!moe) continue;
        const int64_t experts = moe->experts();
        if (experts % res.size != 0)
            throw InputError(at, fmt::format("expert_parallel over '{}' ({} ranks): moe '{}' has {} experts, "
                                             "which do not divide over them (each rank owns experts / ep)",
                                             plan.dims.name(DimRole::ep), res.size, fqn, experts));
        res.layers.push_back(fqn);
        for (int64_t e = 0; e < experts; ++e)
            for_each_param(moe->expert(e), [&](const std::string&, const ParamPtr& p) {
                if (auto it = names.find(p.get()); it != names.end())
                    res.owner[it->second] = expert_owner(e, experts, res.size);
            });
    }
    if (res.layers.empty() && whole_model)
        throw InputError(at, "expert_parallel: the model has no moe layer, so there are no experts to split");
    return res;
}

ExpertParallel::ExpertParallel(Model& model, const ExpertParallelResolution& res, int ep_dim,
                               Communicator& ep, Communicator* replicas, Backend& be)
    : ep_dim_(ep_dim), ep_(ep), replicas_(replicas), be_(be), grad_reduce_(res.grad_reduce) {
    for (const auto& [name, p] : model.named_parameters()) {
        auto it = res.owner.find(name);
        if (it == res.owner.end()) continue;
        owner_[p.get()] = it->second;
        for (const std::string& layer : res.wrong_scale)
            if (name.rfind(layer + ".", 0) == 0) wrong_scale_.insert(p.get());
        if (it->second == ep.rank()) {
            owned_.emplace_back(name, p);
        } else {  // another rank's expert: absent here
            p->value = Tensor(absent_shape(p->value.shape()), p->value.dtype(), p->value.device());
            p->grad = Tensor(absent_shape(p->grad.shape()), p->grad.dtype(), p->grad.device());
        }
    }
}

bool ExpertParallel::owns(const std::string& name) const {
    return std::any_of(owned_.begin(), owned_.end(), [&](const auto& o) { return o.first == name; });
}

Placement ExpertParallel::placement(const Parameter* p) const {
    auto it = owner_.find(p);
    return it == owner_.end() ? Placement::replicate() : Placement::owned(it->second);
}

// An expert's gradient holds every ep rank's tokens' part: divided by ep where data parallel averages
// (each rank's loss a mean over its own tokens, as the dense gradients' average over the data ranks),
// left whole where it sums (global_tokens), then reduced over the expert's replicas alike.
void ExpertParallel::after_backward() {
    const bool average = grad_reduce_ == ReduceOp::avg;
    const double scale = average ? 1.0 / ep_.size() : 1.0;
    for (const auto& [name, p] : owned_) {
        const bool wrong = wrong_scale_.count(p.get()) > 0;  // a fault's: the other normalisation's
        const double s = wrong ? (average ? 1.0 : 1.0 / ep_.size()) : scale;
        if (s != 1.0) be_.scale(p->grad, s, p->grad);
        if (!replicas_ || replicas_->size() == 1) continue;
        CommScope scope(replicas_->counter().get(), name.substr(0, name.rfind('.')),
                        {CommSiteKind::expert_grads});
        replicas_->all_reduce(p->grad, grad_reduce_);
    }
}

}  // namespace ptool
