// The Recorder's observer (verify/recorder_state.h): each module's output and input gradient as a
// step runs (localisation's events), compared with the reference's at once, or kept and compared at
// the step's end while following a reference recorded beside the run.
#include "verify/recorder_state.h"

namespace ptool::recording {

StepObserver Recorder::observer(StepRecord& sr) {
    if (!opt_.events) return nullptr;
    // activation gradients at the reference's scale for comparison
    const double scale = run_.activation_grad_scale();
    auto calls =
        std::make_shared<std::map<std::string, int>>();  // this step's events so far, by key less call
    event_index_.clear();
    return [this, &sr, scale, calls](const std::string& fqn, Phase phase, int microbatch, const Placed& x) {
        Unaccounted pause(&run_.counter());
        ModuleEvent e{fqn, phase, microbatch, 0, Tensor(), {}};
        e.call = (*calls)[fmt::format("{}:{}:{}", microbatch, static_cast<int>(phase), e.fqn)]++;
        const std::string key = event_key(e);
        auto as_reference = [&](const Tensor& t) {  // a backward event at the reference's scale
            if (phase != Phase::backward || scale == 1.0) return t;
            Tensor scaled = empty_like(t);
            backend_for(t.device()).scale(t, scale, scaled);
            return scaled;
        };
        if (local_ && !x.p.is_partial()) {
            if (opt_.follow) {  // compared at the step's end, once the reference published it
                Tensor mine;
                if (activation_box(x.global, x).owner) {
                    mine = as_reference(on_host(x.t));
                    if (mine.shares_storage(x.t)) mine = mine.clone();
                }
                deferred_.push_back({key, Placed{mine, x.p, x.global}, x.t.shape(), true});
            } else if (const ModuleEvent* ref = reference_event(sr.step, key); ref && ref->full.defined()) {
                const Tensor mine = as_reference(on_host(x.t));
                queue_diff(
                    Target::event, key,
                    piece(mine, in_cp_order(ref->full), activation_box(ref->full.shape(), x), opt_.tol));
            }
            if (rank0_) add_event(sr, std::move(e));
            return;
        }
        const Tensor full = as_reference(gather(x));
        if (!rank0_) {  // another stage's: its leader sends it whole to rank 0 (flush)
            if (staged() && leader_) queue(Target::event_tensor, key, tensor_words(on_host(full)));
            return;
        }
        if (!opt_.compare_with) {
            e.full = full.shares_storage(x.t) ? on_host(full).clone() : on_host(full);
        } else if (opt_.follow) {
            const Tensor kept = full.shares_storage(x.t) ? on_host(full).clone() : on_host(full);
            deferred_.push_back({key, Placed{kept, x.p, x.global}, kept.shape(), false});
        } else if (const ModuleEvent* ref = reference_event(sr.step, key)) {
            e.diff = compare_tensors(on_host(full), ref->full, opt_.tol);
        }
        add_event(sr, std::move(e));
    };
}

// Rank 0's event of that key in the step: its own, or (another stage's) one made from the key.
void Recorder::add_event(StepRecord& sr, ModuleEvent e) {
    event_index_[event_key(e)] = sr.events.size();
    sr.events.push_back(std::move(e));
}

ModuleEvent& Recorder::event_of(StepRecord& sr, const std::string& key) {
    if (auto it = event_index_.find(key); it != event_index_.end()) return sr.events[it->second];
    ModuleEvent e;  // MICROBATCH:PHASE:CALL:FQN
    size_t a = key.find(':'), b = key.find(':', a + 1), c = key.find(':', b + 1);
    e.microbatch = std::stoi(key.substr(0, a)),
    e.phase = static_cast<Phase>(std::stoi(key.substr(a + 1, b - a - 1)));
    e.call = std::stoi(key.substr(b + 1, c - b - 1)), e.fqn = key.substr(c + 1);
    add_event(sr, std::move(e));
    return sr.events.back();
}

// The reference's step (null: none, or no reference); following one recorded beside this
// run, it waits until that step is published.
const StepRecord* Recorder::reference_step(int64_t step) const {
    if (!opt_.compare_with) return nullptr;
    if (opt_.follow) return opt_.follow->step(step);
    const RunRecord& ref = *opt_.compare_with;
    return step < static_cast<int64_t>(ref.steps.size()) ? &ref.steps[step] : nullptr;
}

// The reference's event of that key in the step (null: none).
const ModuleEvent* Recorder::reference_event(int64_t step, const std::string& key) {
    const StepRecord* ref = reference_step(step);
    if (!ref) return nullptr;
    if (ref != ref_events_of_) {
        ref_events_.clear(), ref_events_of_ = ref;
        for (const ModuleEvent& e : ref->events) ref_events_.emplace(event_key(e), &e);
    }
    auto it = ref_events_.find(key);
    return it == ref_events_.end() ? nullptr : it->second;
}

// The step's module events kept while following the reference, compared now in the order they
// were recorded: rank-local ones collectively (every rank kept the same list), gathered ones
// on rank 0; the numbers are what comparing them inside the step gives.
void Recorder::compare_deferred(StepRecord& sr, const StepRecord* ref_step) {
    for (const Deferred& d : deferred_) {
        const ModuleEvent* ref = ref_step ? reference_event(sr.step, d.key) : nullptr;
        if (!d.local) {
            if (ref) event_of(sr, d.key).diff = compare_tensors(d.x.t, ref->full, opt_.tol);
            continue;
        }
        if (!ref || !ref->full.defined()) continue;
        const Box b = activation_box(ref->full.shape(), d.x);
        queue_diff(Target::event, d.key,
                   d.shape != b.shape ? bad_shape()
                   : b.owner          ? piece(d.x.t, in_cp_order(ref->full), b, opt_.tol)
                                      : DiffPiece{});
    }
    deferred_.clear();
}

}  // namespace ptool::recording
