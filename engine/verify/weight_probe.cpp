#include "verify/weight_probe.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>

namespace ptool {
namespace {

bool same_bits(const StepTensors& a, const StepTensors& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        const Tensor &x = a[i].second, &y = b[i].second;
        if (a[i].first != b[i].first || x.dtype() != y.dtype() || x.shape() != y.shape()) return false;
        if (x.nbytes() > 0 && std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0)
            return false;  // (recorded on the host)
    }
    return true;
}

}  // namespace

std::optional<std::string> localise_weight(const Schedule& schedule, const StepZero& step0) {
    const StepTensors as_run = step0({});
    for (int stage = 0; stage < schedule.stages; ++stage) {
        std::vector<int> weights;  // the stage's W microbatches, in its list's order
        for (const Action& a : schedule.ranks[static_cast<size_t>(schedule.rank_of(stage))])
            if (a.kind == ActionKind::backward_weight && a.stage == stage) weights.push_back(a.microbatch);
        if (weights.empty()) continue;
        const StepTensors whole = step0([stage](Schedule& s) { s = unsplit(std::move(s), stage, -1); });
        if (same_bits(whole, as_run)) continue;  // the stage's split changes nothing
        for (int m : weights)
            if (same_bits(step0([stage, m](Schedule& s) { s = unsplit(std::move(s), stage, m); }), whole))
                return fmt::format("W{}@{} (stage {}, microbatch {}, on pp rank {})", m, stage, stage, m,
                                   schedule.rank_of(stage));
        return fmt::format("stage {}'s Ws", stage);
    }
    return std::nullopt;
}

std::string split_backward_localisation(const PlanReport& rep, const Plan& plan, const Model& model,
                                        const StepZero& step0) {
    const bool gradients =
        rep.divergence && (rep.divergence->kind == "grad" || rep.divergence->kind == "grad_norm");
    if (rep.pass || !gradients || !plan.pipeline || !splits_backward(plan.pipeline->schedule)) return "";
    const Schedule schedule = checked_pipeline_schedule(
        plan.pipeline->schedule, plan.pipeline_stages(), static_cast<int>(plan.microbatches_per_round()),
        static_cast<int>(plan.accumulation_rounds(model)), plan.pipeline->virtual_stages);
    std::optional<std::string> where;
    try {
        where = localise_weight(schedule, step0);
    } catch (const std::exception& e) {  // a probe that cannot run localises nothing
        spdlog::debug("the split backward's localisation did not run: {}", e.what());
    }
    if (!where) return "";
    return fmt::format(
        "; the split backward's {}: run as one backward with its I it gives the stage's "
        "unsplit gradients, bit for bit",
        *where);
}

}  // namespace ptool
