// The candidates plan lists, simulated whole (plan/search_state.h): as explain simulates the plan
// it writes (every rank class, the whole model, the caching allocator at the GPU's capacity), so
// that a listed plan's memory is explain's. The samples rank the candidates; the whole model
// confirms what is listed: the allocator's excess over the allocated peak grows with the blocks in
// ways two samples do not show (a 70B at dp8 x tp8, fully checkpointed: 1.68 GiB at 4 blocks, 2.02
// at 5, 8.09 at 80, where the samples said 2.02), and a listed plan explain called out of memory.
#include <algorithm>

#include "core/parallel_for.h"
#include "plan/explain_report.h"
#include "plan/search_state.h"
#include "train/simulate.h"

namespace ptool::searching {

// One candidate's memory from the whole model: its worst rank's allocated and reserved peaks (with
// PyTorch's cuBLAS workspaces, as explain adds them); a rejection where it does not fit.
std::optional<Rejection> Search::simulate_whole(Candidate& c) const {
    const Plan plan = load_emitted_plan(c.plan_text, "generated.yaml");
    RunInputs in;
    in.model_path = name_, in.model_text = text_;
    const double ws = workspaces(), cap_bytes = cap(plan);
    const auto capacity = static_cast<size_t>(std::max(1.0, cap_bytes - ws));  // explain's
    const int64_t steps = std::clamp<int64_t>(full_.steps, kSteadyStateSteps, 4);
    const std::string shape = c.choice.pp > 1 ? pipeline_shape(c.choice) : flat_shape(c.choice);
    try {
        check_explain_work(full_, plan, steps);
    } catch (const InputError&) {
        return std::nullopt;  // past explain's bound too: the samples' memory stands (whole stays false)
    }
    double peak = 0, reserved = 0;
    int64_t over = 0;
    try {
        for (const PredictedRank& r : predict_ranks(in, full_, plan, steps, 1, capacity)) {
            const auto& m = r.sim.memory;
            peak = std::max(peak, static_cast<double>(m.torch_peak) + ws);
            reserved = std::max(reserved, static_cast<double>(std::max(m.torch_peak, m.reserved_peak)) + ws);
            over = std::max(over, m.over_capacity);
        }
    } catch (const InputError& e) {  // a rank the samples did not build refuses the plan
        return Rejection{shape, e.message(), RejectionKind::refused};
    }
    if (over > 0 || reserved > cap_bytes)
        return Rejection{
            shape,
            fmt::format("needs {} > {} per GPU simulated whole, as explain does ({} from the samples "
                        "of 4 and 5 blocks)",
                        over > 0 ? fmt::format("more than {}", gib(cap_bytes)) : gib(reserved),
                        gib(cap_bytes), gib(c.reserved)),
            RejectionKind::memory};
    c.peak = peak, c.reserved = reserved, c.whole = true;
    return std::nullopt;
}

// The fastest `keep` (every one where keep is 0) simulated whole, a batch at a time on every core:
// those that do not fit are rejected and the next confirmed in their place. The candidates after
// them keep the samples' memory (Candidate::whole false).
void Search::confirm_listed() {
    const size_t keep = o_.keep > 0 ? static_cast<size_t>(o_.keep) : r_.fitting.size();
    std::vector<Candidate> listed;
    size_t next = 0;
    while (listed.size() < keep && next < r_.fitting.size()) {
        const size_t n = std::min(keep - listed.size(), r_.fitting.size() - next);
        std::vector<std::optional<Rejection>> refused(n);
        parallel_for(n, o_.threads, [&](size_t i) {  // (the dp x tp plans confirmed before the pipelines)
            if (!r_.fitting[next + i].whole) refused[i] = simulate_whole(r_.fitting[next + i]);
        });
        for (size_t i = 0; i < n; ++i) {  // in the search's order: the same output on any thread count
            if (refused[i])
                r_.rejected.push_back(*refused[i]);
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
