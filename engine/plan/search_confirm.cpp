// The candidates plan lists, simulated whole (plan/search_state.h): as explain simulates the plan
// it writes (every rank class, the whole model, the caching allocator at the GPU's capacity), so
// that a listed plan's memory is explain's. The samples rank the candidates; the whole model
// confirms what is listed: the allocator's excess over the allocated peak grows with the blocks in
// ways two samples do not show (a 70B at dp8 x tp8, fully checkpointed: 1.68 GiB at 4 blocks, 2.02
// at 5, 8.09 at 80, where the samples said 2.02), and a listed plan explain called out of memory.
#include <algorithm>
#include <map>

#include "core/parallel_for.h"
#include "parallel/parallelize.h"
#include "plan/explain_report.h"
#include "plan/search_state.h"
#include "train/simulate.h"

namespace ptool::searching {

// One listed candidate's whole simulation: its plan, resolved once against the model (every rank
// class's Run rebinds the resolution, as explain's do), its rank classes, and each class's peaks.
struct Search::Whole {
    Candidate* c = nullptr;
    Plan plan;
    std::optional<Resolution> resolution;
    std::vector<RankClass> classes;
    struct Peaks {
        double peak = 0, reserved = 0;       // with PyTorch's cuBLAS workspaces, as explain adds them
        int64_t over = 0;                    // bytes the allocator model could not place
        std::optional<std::string> refused;  // a rank the samples did not build refuses the plan
    };
    std::vector<Peaks> peaks;  // per class
    std::optional<Rejection> refused;
    bool simulated = false;  // false: past explain's bound, the samples' memory stands
};

// The plan read back, past explain's bound or not, resolved, and cut into its rank classes.
void Search::prepare_whole(Whole& w) const {
    w.plan = load_emitted_plan(w.c->plan_text, "generated.yaml");
    try {
        check_explain_work(full_, w.plan, whole_steps());
    } catch (const InputError&) {
        return;  // past explain's bound too: the samples' memory stands (whole stays false)
    }
    try {
        w.resolution = resolve_plan(full_, w.plan);
    } catch (const InputError& e) {
        w.refused = Rejection{shape_of(w.c->choice), e.message(), RejectionKind::refused};
        return;
    }
    w.classes = rank_classes(full_, w.plan);
    w.peaks.resize(w.classes.size());
    w.simulated = true;
}

// Rank class `k` of the candidate simulated whole, the caching allocator at the GPU's capacity
// (explain's).
void Search::simulate_class(Whole& w, size_t k) const {
    RunInputs in;
    in.model_path = name_, in.model_text = text_;
    const double ws = workspaces();
    const auto capacity = static_cast<size_t>(std::max(1.0, cap(w.plan) - ws));  // explain's
    const ResolvedPlan resolved{&w.plan, &full_, &*w.resolution};
    Whole::Peaks& p = w.peaks[k];
    try {
        const RankSimulation sim =
            simulate_rank(in, w.plan, w.classes[k].ranks.front(), whole_steps(), false, capacity, &resolved);
        const RankMemory& m = sim.memory;
        p.peak = static_cast<double>(m.torch_peak) + ws;
        p.reserved = static_cast<double>(std::max(m.torch_peak, m.reserved_peak)) + ws;
        p.over = m.over_capacity;
    } catch (const InputError& e) {
        p.refused = e.message();
    }
}

// The candidate's worst rank's allocated and reserved peaks; a rejection where it does not fit.
std::optional<Rejection> Search::finish_whole(Whole& w) const {
    if (w.refused || !w.simulated) return w.refused;
    const std::string shape = shape_of(w.c->choice);
    double peak = 0, reserved = 0;
    int64_t over = 0;
    for (const Whole::Peaks& p : w.peaks) {  // in class order: the first refusal, as one thread's
        if (p.refused) return Rejection{shape, *p.refused, RejectionKind::refused};
        peak = std::max(peak, p.peak), reserved = std::max(reserved, p.reserved),
        over = std::max(over, p.over);
    }
    const double cap_bytes = cap(w.plan);
    if (over > 0 || reserved > cap_bytes)
        return Rejection{
            shape,
            fmt::format("needs {} > {} per GPU simulated whole, as explain does ({} from the samples "
                        "of 4 and 5 blocks)",
                        over > 0 ? fmt::format("more than {}", gib(cap_bytes)) : gib(reserved),
                        gib(cap_bytes), gib(w.c->reserved)),
            RejectionKind::memory};
    w.c->peak = peak, w.c->reserved = reserved, w.c->whole = true;
    return std::nullopt;
}

// The fastest `keep` (every one where keep is 0) simulated whole, a batch at a time, every rank
// class of the batch's candidates on every core: those that do not fit are rejected and the next
// confirmed in their place. The candidates after them keep the samples' memory (Candidate::whole
// false).
void Search::confirm_listed() {
    const size_t keep = o_.keep > 0 ? static_cast<size_t>(o_.keep) : r_.fitting.size();
    std::vector<Candidate> listed;
    size_t next = 0;
    while (listed.size() < keep && next < r_.fitting.size()) {
        const size_t n = std::min(keep - listed.size(), r_.fitting.size() - next);
        std::vector<Whole> whole;  // (the dp x tp plans confirmed before the pipelines: whole already)
        for (size_t i = 0; i < n; ++i)
            if (!r_.fitting[next + i].whole) whole.emplace_back().c = &r_.fitting[next + i];
        parallel_for(whole.size(), o_.threads, [&](size_t i) { prepare_whole(whole[i]); });
        std::vector<std::pair<size_t, size_t>> classes;  // (candidate, class)
        for (size_t i = 0; i < whole.size(); ++i)
            for (size_t k = 0; k < whole[i].classes.size(); ++k) classes.emplace_back(i, k);
        parallel_for(classes.size(), o_.threads,
                     [&](size_t j) { simulate_class(whole[classes[j].first], classes[j].second); });
        std::map<const Candidate*, Rejection> refused;
        for (Whole& w : whole)
            if (std::optional<Rejection> r = finish_whole(w)) refused.emplace(w.c, std::move(*r));
        for (size_t i = 0; i < n; ++i) {  // in the search's order: the same output on any thread count
            if (auto it = refused.find(&r_.fitting[next + i]); it != refused.end())
                r_.rejected.push_back(std::move(it->second));
            else
                listed.push_back(std::move(r_.fitting[next + i]));
        }
        next += n;
    }
    listed.insert(listed.end(),
                  std::make_move_iterator(r_.fitting.begin() + static_cast<std::ptrdiff_t>(next)),
                  std::make_move_iterator(r_.fitting.end()));
    r_.fitting = std::move(listed);
}

}  // namespace ptool::searching
