// The shadow optimizer (verify/recorder_state.h): the model's optimizer stepping full-size copies of
// the parameters with the gradients the run recorded, so each step's parameters are checked against
// what the optimizer makes of the run's own gradients (StepRecord::vs_shadow, verify/report.cpp).
#include "verify/recorder_state.h"

namespace ptool::recording {

// The shadow optimizer (rank 0, compared runs, AdamW): the model's optimizer stepping full-size
// copies of the parameters with the gradients this run recorded, so each step's parameters can
// be checked against what the optimizer makes of the run's own gradients (verify/report.cpp).
void Recorder::start_shadow() {  // collective: every rank gathers, rank 0 keeps
    // AdamW amplifies rounding-sized gradient differences; under mixed precision every update
    // carries the compute dtype's into the full-precision masters
    if (!opt_.shadow_optimizer || (run_.model().optimizer.type != OptimizerType::adamw && !opt_.tol.masters))
        return;
    Unaccounted pause(&run_.counter());
    if (piecewise_shadow()) {  // each rank steps its own pieces: the optimizer is elementwise
        for (const auto& [name, p] : run_.model().named_parameters()) {
            auto s = std::make_shared<Parameter>();
            s->value = on_host(p->value).clone();
            shadow_.emplace_back(name, s);
        }
        shadow_opt_ = std::make_unique<Optimizer>(run_.model().optimizer, backend_for(Device::cpu));
        return;
    }
    for (const auto& [name, p] : run_.model().named_parameters()) {
        const Tensor full = gather(p->value, run_.placements(p.get()));
        if (!rank0_) continue;
        auto s = std::make_shared<Parameter>();
        s->value = on_host(full).clone();
        shadow_.emplace_back(name, s);
    }
    if (rank0_) shadow_opt_ = std::make_unique<Optimizer>(run_.model().optimizer, backend_for(Device::cpu));
}

// The run's gradient of parameter i for the shadow optimizer: this rank's own (a pipeline, rank-local
// pieces, a weight tied across stages: `recorded` undefined) or the whole one rank 0 recorded.
void Recorder::shadow_grad(size_t i, const Parameter& p, const Tensor& recorded) {
    if (shadow_.empty()) return;
    shadow_[i].second->grad =
        piecewise_shadow() || !recorded.defined() ? on_host(p.grad).clone() : recorded.clone();
}

void Recorder::shadow_step() {
    if (!shadow_.empty()) shadow_opt_->step(shadow_);
}

// Parameter i after the run's step against the shadow's: this rank's piece against its shadow piece,
// counted once per group of replicas, or rank 0's whole `recorded` one.
void Recorder::shadow_compare(StepRecord& sr, const std::string& key, size_t i, const Parameter& p,
                              const Tensor& recorded) {
    if (shadow_.empty()) return;
    if (piecewise_shadow()) {
        const Placements pl = run_.placements(&p);
        const Box b{std::vector<int64_t>(p.value.dim(), 0), p.value.shape(), owns(pl), threads(pl)};
        queue_diff(Target::shadow, key,
                   piece(on_host(p.value), shadow_[i].second->value, b, opt_.tol.for_masters()));
    } else if (rank0_) {
        sr.vs_shadow[key] = compare_tensors(recorded, shadow_[i].second->value, opt_.tol.for_masters());
    }
}

}  // namespace ptool::recording
