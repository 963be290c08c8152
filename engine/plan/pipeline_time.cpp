#include "plan/pipeline_time.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/device_mesh.h"

namespace ptool {
namespace {

bool is_work(const Action& a) {
    return a.kind == ActionKind::forward || a.is_backward();  // B, or a split backward's I and W
}

// Each p2p action's partner, as (rank, entry), resolved once through one flat table of every
// transfer by (direction, stage, microbatch): the critical path then reads it by index.
struct Partners {
    std::vector<std::vector<std::pair<int, uint32_t>>>
        of;  // per rank, per action (rank -1: none, or compute)

    explicit Partners(const std::vector<TimedList>& ranks) {
        size_t stages = 0, microbatches = 0;
        for (const TimedList& list : ranks)
            for (const Action& a : list.actions)
                if (a.is_p2p()) {
                    PTOOL_REQUIRE(a.stage >= 0 && a.microbatch >= 0, "a transfer {} of no stage", a.str());
                    stages = std::max(stages, static_cast<size_t>(a.stage) + 2);  // a partner's too
                    microbatches = std::max(microbatches, static_cast<size_t>(a.microbatch) + 1);
                }
        auto slot = [&](const Action& a) {  // the 4 p2p kinds follow backward in ActionKind
            const size_t kind = static_cast<size_t>(a.kind) - static_cast<size_t>(ActionKind::send_forward);
            return (kind * stages + static_cast<size_t>(a.stage)) * microbatches +
                   static_cast<size_t>(a.microbatch);
        };
        std::vector<std::pair<int, uint32_t>> where(4 * stages * microbatches, {-1, 0});
        for (size_t r = 0; r < ranks.size(); ++r)
            for (size_t i = 0; i + 1 < ranks[r].first.size(); ++i)
                for (uint32_t k = ranks[r].first[i]; k < ranks[r].first[i + 1]; ++k)
                    if (const Action& a = ranks[r].actions[k]; a.is_p2p())
                        where[slot(a)] = {static_cast<int>(r), static_cast<uint32_t>(i)};
        of.resize(ranks.size());
        for (size_t r = 0; r < ranks.size(); ++r) {
            of[r].assign(ranks[r].actions.size(), {-1, 0});
            for (size_t k = 0; k < ranks[r].actions.size(); ++k) {
                const Action& a = ranks[r].actions[k];
                if (!a.is_p2p()) continue;
                const Action q = p2p_partner(a);
                if (q.stage >= 0 && static_cast<size_t>(q.stage) < stages) of[r][k] = where[slot(q)];
            }
        }
    }
};

}  // namespace

PipelineTiming pipeline_critical_path(const std::vector<std::vector<TimedActions>>& ranks) {
    std::vector<std::vector<Action>> actions(ranks.size());
    std::vector<TimedList> lists(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
        for (size_t i = 0; i < ranks[r].size(); ++i) {
            const TimedActions& e = ranks[r][i];
            PTOOL_REQUIRE(e.actions.size() == e.seconds.size() && !e.actions.empty(),
                          "rank {} entry {}: {} actions, {} durations", r, i, e.actions.size(),
                          e.seconds.size());
            lists[r].first.push_back(static_cast<uint32_t>(actions[r].size()));
            actions[r].insert(actions[r].end(), e.actions.begin(), e.actions.end());
            lists[r].seconds.insert(lists[r].seconds.end(), e.seconds.begin(), e.seconds.end());
        }
        lists[r].first.push_back(static_cast<uint32_t>(actions[r].size()));
        lists[r].actions = actions[r];
    }
    return pipeline_critical_path(lists);
}

// torch's runtime posts each send and receive where its list has it (isend / irecv) and waits for
// a receive only before the compute that uses it (a forward its RECV_F, a backward or I its
// RECV_B); its sends are waited for at the step's end. So a rank never waits at a transfer: a
// compute that consumes a receive starts once its data has arrived, the partner's send posted and
// the transfer's seconds after both were. Each rank runs its list until such a compute's send has
// not been posted yet; it waits there and runs on when the partner posts it (event-driven: every
// entry is visited a bounded number of times and a transfer's partner is an index, so a step of
// many ranks and microbatches costs its actions).
PipelineTiming pipeline_critical_path(const std::vector<TimedList>& ranks) {
    const int p = static_cast<int>(ranks.size());
    PTOOL_REQUIRE(p >= 1, "a pipeline of no ranks");
    const Partners partners(ranks);
    PipelineTiming out;
    out.busy.assign(p, 0.0), out.finish.assign(p, 0.0);
    std::vector<double> t(p, 0.0);
    std::vector<uint32_t> next(p, 0);
    std::vector<size_t> entries(p);
    std::vector<std::vector<double>> posted(p);  // when the rank reached each entry (-1: not yet)
    // per rank, per action: its entry; and per compute action the receive it consumes (-1: none)
    std::vector<std::vector<uint32_t>> entry_of(p);
    std::vector<std::vector<int64_t>> consumes(p);
    for (int r = 0; r < p; ++r) {
        const TimedList& list = ranks[r];
        entries[r] = list.first.size() - 1, posted[r].assign(entries[r], -1.0);
        entry_of[r].assign(list.actions.size(), 0), consumes[r].assign(list.actions.size(), -1);
        std::map<std::tuple<ActionKind, int, int>, int64_t> receive;  // (kind, stage, microbatch) -> action
        for (size_t i = 0; i < entries[r]; ++i)
            for (uint32_t k = list.first[i]; k < list.first[i + 1]; ++k) {
                entry_of[r][k] = static_cast<uint32_t>(i);
                const Action& a = list.actions[k];
                if (a.kind == ActionKind::recv_forward || a.kind == ActionKind::recv_backward)
                    receive[{a.kind, a.stage, a.microbatch}] = k;
                const ActionKind wants =
                    a.kind == ActionKind::forward ? ActionKind::recv_forward
                    : a.kind == ActionKind::backward || a.kind == ActionKind::backward_input
                        ? ActionKind::recv_backward
                        : ActionKind::grad_sync;  // (none)
                if (wants == ActionKind::grad_sync) continue;
                if (auto it = receive.find({wants, a.stage, a.microbatch}); it != receive.end())
                    consumes[r][k] = it->second;
            }
    }
    // the send entry a rank waits for its peer to post (rank -1: none); a rank that posts an entry
    // wakes its partners that wait on it
    std::vector<std::pair<int, uint32_t>> blocked_on(p, {-1, 0});
    std::vector<int> ready;
    for (int r = p - 1; r >= 0; --r) ready.push_back(r);
    while (!ready.empty()) {
        const int r = ready.back();
        ready.pop_back();
        const TimedList& list = ranks[r];
        while (next[r] < entries[r]) {
            const uint32_t b = list.first[next[r]], e = list.first[next[r] + 1];
            const Action& head = list.actions[b];
            if (head.is_p2p()) {  // posted; a receive is waited for by its consumer
                posted[r][next[r]] = t[r];
                for (uint32_t k = b; k < e; ++k)
                    if (const auto [peer, j] = partners.of[r][k];
                        peer >= 0 && blocked_on[peer] == std::pair<int, uint32_t>{r, next[r]})
                        blocked_on[peer] = {-1, 0}, ready.push_back(peer);
                ++next[r];
                continue;
            }
            if (const int64_t k = consumes[r][b]; k >= 0) {  // its data: sent, then transferred
                const auto [peer, j] = partners.of[r][k];
                PTOOL_REQUIRE(peer >= 0, "rank {}: {} has no partner in any list", r, list.actions[k].str());
                if (posted[peer][j] < 0) {
                    blocked_on[r] = {peer, j};  // runs on when its peer posts the send
                    break;
                }
                const double arrived = std::max(posted[r][entry_of[r][k]], posted[peer][j]) + list.seconds[k];
                out.pipelined = std::max(out.pipelined, arrived);
                t[r] = std::max(t[r], arrived);
            }
            t[r] += list.seconds[b];
            if (is_work(head)) out.busy[r] += list.seconds[b], out.pipelined = std::max(out.pipelined, t[r]);
            ++next[r];
        }
    }
    for (int r = 0; r < p; ++r)
        if (next[r] < entries[r])
            throw RuntimeError(
                fmt::format("pipeline rank {} waits forever in {} (its peers never reach the transfer)", r,
                            ranks[r].actions[ranks[r].first[next[r]]].str()));
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
        CommByOpDim gathers;  // scatter_gather's all_gathers over tp of what was received
        for (const auto& [key, totals] : aw.comm)
            if (collective_row(key.first).p2p)
                bytes += static_cast<double>(totals.bytes);
            else
                gathers[key] = totals;
        StepTime g;
        add_comm_time(g, gathers, plan, c);
        const double n = static_cast<double>(out.seconds.size());
        for (double& s : out.seconds) s = p2p_seconds(bytes / n, plan, c) + (g.blocking + g.overlappable) / n;
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
