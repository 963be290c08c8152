#include "plan/pipeline_time.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/device_mesh.h"

namespace ptool {
namespace {

using ActionKey = std::tuple<int, int, int>;  // kind, stage, microbatch
ActionKey key_of(const Action& a) {
    return {static_cast<int>(a.kind), a.stage, a.microbatch};
}

bool is_work(const Action& a) {
    return a.kind == ActionKind::forward || a.kind == ActionKind::backward;
}

}  // namespace

PipelineTiming pipeline_critical_path(const std::vector<std::vector<TimedActions>>& ranks) {
    const int p = static_cast<int>(ranks.size());
    PTOOL_REQUIRE(p >= 1, "a pipeline of no ranks");
    std::map<ActionKey, std::pair<int, size_t>> where;  // a p2p action's rank and entry
    for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < ranks[r].size(); ++i) {
            const TimedActions& e = ranks[r][i];
            PTOOL_REQUIRE(e.actions.size() == e.seconds.size() && !e.actions.empty(),
                          "rank {} entry {}: {} actions, {} durations", r, i, e.actions.size(),
                          e.seconds.size());
            for (const Action& a : e.actions)
                if (a.is_p2p()) where[key_of(a)] = {r, i};
        }
    PipelineTiming out;
    out.busy.assign(p, 0.0), out.finish.assign(p, 0.0);
    std::vector<double> t(p, 0.0);
    std::vector<size_t> next(p, 0);
    std::vector<std::vector<double>> posted(p);  // when the rank reached each entry (-1: not yet)
    for (int r = 0; r < p; ++r) posted[r].assign(ranks[r].size(), -1.0);
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < p; ++r) {
            while (next[r] < ranks[r].size()) {
                const TimedActions& e = ranks[r][next[r]];
                if (!e.actions.front().is_p2p()) {  // a compute action
                    t[r] += e.seconds[0];
                    if (is_work(e.actions[0]))
                        out.busy[r] += e.seconds[0], out.pipelined = std::max(out.pipelined, t[r]);
                    ++next[r], progress = true;
                    continue;
                }
                if (posted[r][next[r]] < 0) posted[r][next[r]] = t[r];
                double end = t[r];
                bool met = true;
                for (size_t k = 0; k < e.actions.size() && met; ++k) {
                    const auto it = where.find(key_of(p2p_partner(e.actions[k])));
                    PTOOL_REQUIRE(it != where.end(), "rank {}: {} has no partner in any list", r,
                                  e.actions[k].str());
                    const auto [peer, j] = it->second;
                    met = posted[peer][j] >= 0;
                    if (met)
                        end = std::max(end, std::max(posted[r][next[r]], posted[peer][j]) + e.seconds[k]);
                }
                if (!met) break;  // waits for its peer to reach the transfer
                t[r] = end, out.pipelined = std::max(out.pipelined, end);
                ++next[r], progress = true;
            }
        }
    }
    for (int r = 0; r < p; ++r)
        if (next[r] < ranks[r].size())
            throw RuntimeError(
                fmt::format("pipeline rank {} waits forever in {} (its peers never reach the transfer)", r,
                            ranks[r][next[r]].actions.front().str()));
    out.finish = t;
    out.step = *std::max_element(t.begin(), t.end());
    const double work = *std::max_element(out.busy.begin(), out.busy.end());
    out.bubble = work > 0 ? (out.pipelined - work) / work : 0;
    return out;
}

ActionTime action_time(const ActionWork& aw, const Plan& plan, const Cluster& c, DType compute) {
    ActionTime out;
    out.seconds.assign(aw.actions.size(), 0.0);
    if (aw.actions.front().is_p2p()) {
        double bytes = 0;
        for (const auto& [key, totals] : aw.comm)
            if (key.first == "send" || key.first == "recv") bytes += static_cast<double>(totals.bytes);
        for (double& s : out.seconds)
            s = p2p_seconds(bytes / static_cast<double>(out.seconds.size()), plan, c);
        return out;
    }
    StepTime t;
    add_comm_time(t, aw.comm, plan, c);
    out.compute = compute_seconds(aw.work, c, compute), out.overlappable = t.overlappable;
    out.seconds[0] = out.compute + t.blocking;
    return out;
}

void time_pipeline(std::vector<StepTime>& times, const std::vector<PredictedRank>& ranks, const Plan& plan,
                   const Cluster& c, DType compute) {
    const int pp_dim = plan.dims.index(DimRole::pp);
    PTOOL_REQUIRE(pp_dim >= 0 && times.size() == ranks.size(), "a pipeline's times of {} classes for {}",
                  times.size(), ranks.size());
    const int p = plan.mesh()[pp_dim].size;
    std::vector<std::vector<TimedActions>> lists(p);
    for (const PredictedRank& pr : ranks) {
        const int r = DeviceMesh::coords_of(pr.ranks.front(), plan.mesh())[pp_dim];
        std::vector<TimedActions>& list = lists[r];
        const std::vector<ActionWork>& acts = pr.sim.actions;
        const bool first = list.empty();
        PTOOL_REQUIRE(first || list.size() == acts.size(), "pp rank {}'s classes ran {} and {} actions", r,
                      list.size(), acts.size());
        if (first) list.resize(acts.size());
        MetaWork outside = pr.sim.step_work;  // the step's work outside its actions (zero_grad, casts)
        for (const ActionWork& aw : acts) outside = work_since(aw.work, outside);
        bool first_compute = true;
        for (size_t i = 0; i < acts.size(); ++i) {
            const ActionWork& aw = acts[i];
            std::vector<double> seconds = action_time(aw, plan, c, compute).seconds;
            if (!aw.actions.front().is_p2p() && first_compute)
                seconds[0] += compute_seconds(outside, c, compute), first_compute = false;
            if (first) list[i].actions = aw.actions, list[i].seconds = seconds;
            for (size_t k = 0; k < seconds.size(); ++k)  // the slowest class of the stage
                list[i].seconds[k] = std::max(list[i].seconds[k], seconds[k]);
        }
    }
    const PipelineTiming timing = pipeline_critical_path(lists);
    double exposed = 0;  // the data-parallel collectives that the compute does not hide
    for (const StepTime& t : times) exposed = std::max(exposed, std::max(0.0, t.overlappable - t.compute));
    for (StepTime& t : times)
        t.pipeline = timing.step, t.bubble = timing.bubble, t.step = timing.step + exposed;
}

}  // namespace ptool
