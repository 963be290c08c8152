#include "plan/pipeline_search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "parallel/device_mesh.h"

namespace ptool {
namespace {

bool is_tail(const Action& a) {
    return a.kind == ActionKind::grad_sync || a.kind == ActionKind::clip ||
           a.kind == ActionKind::optimizer_step;
}

// What one simulated pp rank says about its stages and itself.
struct RankCosts {
    std::map<int, std::array<double, 5>>
        stages;  // stage -> forward s, backward s (I and W), forward flops, backward flops, I s
    double peak = 0, tail = 0, transfer = 0, fb_compute = 0, fb_overlap = 0, tail_compute = 0,
           tail_overlap = 0, static_at_peak = 0, activations_at_peak = 0;
    std::vector<double> in_flight;  // per local stage, where the rank holds the most microbatches
    CommByOpDim fb_comm, tail_comm;
    std::map<std::string, double> phases;
};

// "layers.9.attn_block/b" on a rank whose stages hold blocks[s] blocks each -> "layers.stage1.last.
// attn_block/b" (its second stage's last block); a block between the first and the last -> "" (its
// peaks are below the last's); any other pass as it is.
std::string stage_phase(const std::string& label, const std::string& repeat, const std::vector<int>& blocks,
                        const std::vector<int>& stage_rank) {
    if (repeat.empty() || label.rfind(repeat + ".", 0) != 0) return label;
    const size_t start = repeat.size() + 1, end = label.find_first_of("./", start);
    const std::string index = label.substr(start, end - start);
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return label;
    const int i = std::stoi(index);
    int stage = 0, first = 0;  // the block's stage and that stage's first block
    while (stage < static_cast<int>(blocks.size()) && i >= first + blocks[stage]) first += blocks[stage++];
    if (stage >= static_cast<int>(blocks.size()) || stage >= static_cast<int>(stage_rank.size()))
        return label;
    int local = 0;  // the stage's place among its rank's
    for (int s = 0; s < stage; ++s) local += stage_rank[s] == stage_rank[stage];
    const std::string rest = end == std::string::npos ? "" : label.substr(end);
    if (i == first) return fmt::format("{}.stage{}.first{}", repeat, local, rest);
    if (i == first + blocks[stage] - 1) return fmt::format("{}.stage{}.last{}", repeat, local, rest);
    return "";
}

void add_into(CommByOpDim& to, const CommByOpDim& from) {
    for (const auto& [key, t] : from) to[key].calls += t.calls, to[key].bytes += t.bytes;
}

// Each of pp rank `rank`'s stages' microbatches in flight (forwards run, their backwards not yet)
// at the first point of its schedule where it holds the most in all.
std::vector<double> in_flight_at_most(const std::vector<ActionWork>& actions, int rank,
                                      const std::vector<int>& stage_rank) {
    auto mine = [&](int s) {
        return s >= 0 && s < static_cast<int>(stage_rank.size()) && stage_rank[s] == rank;
    };
    std::map<int, int> now;  // every local stage of the rank, from 0 (one not yet run counts 0)
    for (const ActionWork& aw : actions)
        if (const int s = aw.actions.front().stage; mine(s)) now.emplace(s, 0);
    std::map<int, int> most;
    int total = 0, best = -1;
    for (const ActionWork& aw : actions) {
        const Action& a = aw.actions.front();
        if (a.kind == ActionKind::forward)
            ++now[a.stage], ++total;
        else if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight)
            --now[a.stage], --total;
        else
            continue;
        if (total > best) best = total, most = now;
    }
    std::vector<double> out;
    for (const auto& [stage, n] : most)
        if (mine(stage)) out.push_back(std::max(0, n));
    return out;
}

RankCosts costs_of(const RankSimulation& sim, const Plan& plan, const Plan& timing, const Cluster& c,
                   DType compute, const std::string& repeat, int k, int rank) {
    const std::vector<int> placed =
        stage_placement(plan.pipeline->schedule, plan.dims.size(DimRole::pp), plan.pipeline_stages());
    const std::vector<int> blocks = sampled_stage_blocks(placed, rank, k);  // what the rank ran
    RankCosts out;
    for (const auto& [label, peak] : sim.phase_peaks)
        if (std::string key = stage_phase(label, repeat, blocks, placed); !key.empty())
            out.phases[key] = std::max(out.phases[key], static_cast<double>(peak));
    // stage -> f s, b s, f flops, b flops, f count, b count (a B or an I: a microbatch's), I s, I count
    // (DualPipeV runs some microbatches' backwards whole, some split: an I's seconds are the Is')
    std::map<int, std::array<double, 8>> sums;
    for (const ActionWork& aw : sim.actions) {
        const Action& a = aw.actions.front();
        add_into(is_tail(a) ? out.tail_comm : out.fb_comm, aw.comm);
        const ActionTime t = action_time(aw, timing, c, compute);
        if (a.is_p2p()) {
            out.transfer = std::max(out.transfer, t.seconds.front());
            continue;
        }
        const double seconds = t.seconds.front();
        if (is_tail(a)) {
            out.tail += seconds, out.tail_compute += t.compute, out.tail_overlap += t.overlappable;
            continue;
        }
        out.fb_compute += t.compute, out.fb_overlap += t.overlappable;
        const bool fwd = a.kind == ActionKind::forward;
        std::array<double, 8>& s = sums[a.stage];
        s[fwd ? 0 : 1] += seconds;
        s[fwd ? 2 : 3] += aw.work.gemm_flops - aw.work.recompute_flops;
        if (a.kind != ActionKind::backward_weight) s[fwd ? 4 : 5] += 1;
        if (a.kind == ActionKind::backward_input) s[6] += seconds, s[7] += 1;
    }
    // the step's work outside its actions (zero_grad, casts), as time_pipeline prices it: in the
    // rank's own time (explain adds it to the rank's first compute action; here to its tail)
    MetaWork outside = sim.step_work;
    for (const ActionWork& aw : sim.actions) outside = work_since(aw.work, outside);
    const double extra = compute_seconds(outside, c, compute);
    out.tail += extra, out.tail_compute += extra;
    for (const auto& [stage, s] : sums)
        out.stages[stage] = {s[0] / std::max(1.0, s[4]), s[1] / std::max(1.0, s[5]),
                             s[2] / std::max(1.0, s[4]), s[3] / std::max(1.0, s[5]),
                             s[6] / std::max(1.0, s[7])};
    out.peak = static_cast<double>(sim.memory.peak);
    const auto& by_use = sim.memory.torch_at_peak;
    for (MemoryUse u : {MemoryUse::parameters, MemoryUse::gradients, MemoryUse::optimizer,
                        MemoryUse::mixed_precision, MemoryUse::buckets})
        out.static_at_peak += static_cast<double>(by_use[static_cast<int>(u)]);
    out.activations_at_peak = static_cast<double>(by_use[static_cast<int>(MemoryUse::activations)]);
    out.in_flight = in_flight_at_most(sim.actions, rank, placed);
    return out;
}

}  // namespace

std::vector<int> sampled_stage_blocks(const std::vector<int>& stage_rank, int holder, int k) {
    std::vector<int> blocks;
    for (int r : stage_rank) blocks.push_back(r == holder ? k : 1);
    return blocks;
}

PipelineSample sample_pipeline(const Plan& plan, const Cluster& c, DType compute, const std::string& repeat,
                               int k, const std::function<RankSimulation(int rank)>& simulate,
                               const Plan* timing) {
    const int pp_dim = plan.dims.index(DimRole::pp);
    PTOOL_REQUIRE(pp_dim >= 0, "a pipeline sample of a plan without pp");
    const int pp = plan.mesh()[pp_dim].size, stages = plan.pipeline_stages();
    const std::vector<int> placed = stage_placement(plan.pipeline->schedule, pp, stages);
    std::map<int, RankCosts> ranks;  // pp rank -> its costs: 0, 1 (a middle one) and the last
    for (int q : std::set<int>{0, std::min(1, pp - 1), pp - 1}) {
        std::vector<int> coords(plan.mesh().size(), 0);
        coords[pp_dim] = q;
        ranks[q] = costs_of(simulate(DeviceMesh::rank_of(coords, plan.mesh())), plan, timing ? *timing : plan,
                            c, compute, repeat, k, q);
    }
    const std::array<double, 5>* middle = nullptr;  // a stage that is neither the first nor the last
    for (const auto& [q, rc] : ranks)
        for (const auto& [s, v] : rc.stages)
            if (s != 0 && s != stages - 1 && !middle) middle = &v;
    PipelineSample out;
    out.stage_rank = placed;
    for (int s = 0; s < stages; ++s) {
        const RankCosts& held = ranks.count(placed[s]) ? ranks.at(placed[s]) : ranks.at(1);
        const auto it = held.stages.find(s);
        const std::array<double, 5>* v = it != held.stages.end() ? &it->second : middle;
        PTOOL_REQUIRE(v != nullptr, "no sample of stage {} of {}", s, stages);
        out.forward.push_back((*v)[0]), out.backward.push_back((*v)[1]),
            out.backward_input.push_back((*v)[4]);
        out.forward_flops.push_back((*v)[2]), out.backward_flops.push_back((*v)[3]);
    }
    for (int r = 0; r < pp; ++r) {
        const RankCosts& rc = ranks.count(r) ? ranks.at(r) : ranks.at(1);
        out.peak.push_back(rc.peak), out.tail.push_back(rc.tail), out.phases.push_back(rc.phases);
        out.static_at_peak.push_back(rc.static_at_peak),
            out.activations_at_peak.push_back(rc.activations_at_peak);
        out.in_flight.push_back(rc.in_flight);
        out.fb_compute.push_back(rc.fb_compute), out.fb_overlap.push_back(rc.fb_overlap);
        out.tail_compute.push_back(rc.tail_compute), out.tail_overlap.push_back(rc.tail_overlap);
        out.transfer = std::max(out.transfer, rc.transfer);
    }
    out.fb_comm = ranks.at(0).fb_comm, out.tail_comm = ranks.at(0).tail_comm;
    return out;
}

double uniform_bubble(ScheduleKind kind, int stages, int microbatches, int virtual_stages) {
    const Schedule s = pipeline_schedule(kind, stages, microbatches, 1, virtual_stages);
    PipelineSample unit;
    unit.forward.assign(static_cast<size_t>(stages), 1.0),
        unit.backward.assign(static_cast<size_t>(stages), 2.0);
    unit.backward_input.assign(static_cast<size_t>(stages), 1.0);
    unit.backward_input[0] = 0.0;  // the first stage's I does nothing, its W the whole backward
    unit.tail.assign(s.ranks.size(), 0.0);
    return time_schedule(s, unit).bubble;
}

std::pair<double, double> PipelineSample::split(int stage) const {
    const double b = backward.at(stage);
    const double i = stage < static_cast<int>(backward_input.size()) ? backward_input[stage] : b / 2;
    return {i, b - i};
}

double PipelineSample::exposed(int r, double scale) const {
    return std::max(
        0.0, scale * fb_overlap.at(r) + tail_overlap.at(r) - scale * fb_compute.at(r) - tail_compute.at(r));
}

// (pipeline_search.h) each stage's share of the growth: its static bytes alike, its activations by
// its microbatches in flight
std::vector<int> PipelineSample::stages_of(int r, int pp) const {
    std::vector<int> out;
    for (int s = 0; s < static_cast<int>(forward.size()); ++s)
        if ((stage_rank.empty() ? s % pp : stage_rank[s]) == r) out.push_back(s);
    return out;
}

double rank_blocks_beyond(const PipelineSample& a, const PipelineSample& b, const std::vector<int>& blocks,
                          int r, int pp) {
    const std::vector<int> held = a.stages_of(r, pp);
    const int v = static_cast<int>(held.size());
    std::vector<double> share(v, 1.0 / v);
    const size_t n = static_cast<size_t>(r) + 1;
    const bool weighed = b.in_flight.size() >= n && a.static_at_peak.size() >= n &&
                         b.static_at_peak.size() >= n && a.activations_at_peak.size() >= n &&
                         b.activations_at_peak.size() >= n;
    const std::vector<double> flight = weighed ? b.in_flight[r] : std::vector<double>{};
    const double d_static = weighed ? std::max(0.0, b.static_at_peak[r] - a.static_at_peak[r]) : 0,
                 d_act = weighed ? std::max(0.0, b.activations_at_peak[r] - a.activations_at_peak[r]) : 0;
    double total = 0;
    for (double f : flight) total += f;
    if (static_cast<int>(flight.size()) == v && total > 0 && d_static + d_act > 0)
        for (int j = 0; j < v; ++j)
            share[j] = (d_static / v + d_act * flight[j] / total) / (d_static + d_act);
    double k = 0;
    for (int j = 0; j < v; ++j) k += share[j] * (blocks[held[j]] - kStageSampled);
    return k;
}

PipelineSample extrapolate_pipeline(const PipelineSample& a, const PipelineSample& b,
                                    const std::vector<int>& blocks, int pp) {
    PTOOL_REQUIRE(blocks.size() == a.forward.size() && a.forward.size() == b.forward.size(),
                  "{} stage block counts for samples of {} stages", blocks.size(), a.forward.size());
    const int stages = static_cast<int>(blocks.size());
    auto lin = [](double x, double y, double k) { return x + (y - x) * k; };
    PipelineSample o;
    o.transfer = a.transfer, o.stage_rank = a.stage_rank;
    const double k0 = [&] {  // pp rank 0's blocks beyond the first sample's
        const std::vector<int> first = a.stages_of(0, pp);
        int n = 0;
        for (int s : first) n += blocks[s];
        return static_cast<double>(n - kStageSampled * static_cast<int>(first.size())) / first.size();
    }();
    o.fb_comm = comm_extrapolated(a.fb_comm, b.fb_comm, k0),
    o.tail_comm = comm_extrapolated(a.tail_comm, b.tail_comm, k0);
    for (int s = 0; s < stages; ++s) {
        const double k = blocks[s] - kStageSampled;
        o.forward.push_back(lin(a.forward[s], b.forward[s], k));
        o.backward.push_back(lin(a.backward[s], b.backward[s], k));
        if (s < static_cast<int>(std::min(a.backward_input.size(), b.backward_input.size())))
            o.backward_input.push_back(lin(a.backward_input[s], b.backward_input[s], k));
        o.forward_flops.push_back(lin(a.forward_flops[s], b.forward_flops[s], k));
        o.backward_flops.push_back(lin(a.backward_flops[s], b.backward_flops[s], k));
    }
    for (int r = 0; r < pp; ++r) {  // the rank's stages hold n blocks in all; the samples 4v and 5v
        const double k = rank_blocks_beyond(a, b, blocks, r, pp);
        double peak = lin(a.peak[r], b.peak[r], k);
        for (const auto& [key, pa] : a.phases[r])
            if (auto it = b.phases[r].find(key); it != b.phases[r].end())
                peak = std::max(peak, lin(pa, it->second, k));
        o.peak.push_back(peak);
        o.tail.push_back(lin(a.tail[r], b.tail[r], k));
        o.fb_compute.push_back(lin(a.fb_compute[r], b.fb_compute[r], k));
        o.fb_overlap.push_back(lin(a.fb_overlap[r], b.fb_overlap[r], k));
        o.tail_compute.push_back(lin(a.tail_compute[r], b.tail_compute[r], k));
        o.tail_overlap.push_back(lin(a.tail_overlap[r], b.tail_overlap[r], k));
    }
    return o;
}

PipelineSample widen_pipeline(const PipelineSample& p3, const PipelineSample& p4, int pp, int last_peak_at) {
    for (size_t s = 0; s < p4.stage_rank.size(); ++s)  // (the V is searched up to 4 pp ranks)
        PTOOL_REQUIRE(p4.stage_rank[s] == static_cast<int>(s % 4), "widening samples of the V placement");
    PTOOL_REQUIRE(p3.peak.size() == 3 && p4.peak.size() == 4 && pp > 4,
                  "widening samples of {} and {} ranks to {}", p3.peak.size(), p4.peak.size(), pp);
    const int v = static_cast<int>(p4.forward.size()) / 4, stages = pp * v, last4 = 4 * v - 1;
    const double d = pp - 3;  // pp ranks beyond the first sample's
    auto lin = [d](double x, double y) { return x + (y - x) * d; };
    PipelineSample o;
    o.transfer = p4.transfer;
    for (int s = 0; s < stages; ++s) {  // the first, a middle and the last stage as sampled
        const int from = s == 0 ? 0 : s == stages - 1 ? last4 : 1;
        o.forward.push_back(p4.forward[from]), o.backward.push_back(p4.backward[from]);
        if (from < static_cast<int>(p4.backward_input.size()))
            o.backward_input.push_back(p4.backward_input[from]);
        o.forward_flops.push_back(p4.forward_flops[from]),
            o.backward_flops.push_back(p4.backward_flops[from]);
    }
    // (samples without what their ranks hold at the peak by kind: stages weighed alike)
    const bool weighed = p3.in_flight.size() == 3 && p4.in_flight.size() == 4 &&
                         p3.static_at_peak.size() == 3 && p4.static_at_peak.size() == 4 &&
                         p3.activations_at_peak.size() == 3 && p4.activations_at_peak.size() == 4;
    for (int r = 0; r < pp; ++r) {  // pp rank 0, the last, and pp rank 1 for the others
        const int a = r == 0 ? 0 : r == pp - 1 ? 2 : 1, b = r == 0 ? 0 : r == pp - 1 ? 3 : 1;
        const double at = r == pp - 1 ? last_peak_at - 3 : d;
        auto held = [at](double x, double y) { return x + (y - x) * at; };
        o.peak.push_back(held(p3.peak[a], p4.peak[b]));
        if (weighed) {
            o.static_at_peak.push_back(held(p3.static_at_peak[a], p4.static_at_peak[b]));
            o.activations_at_peak.push_back(held(p3.activations_at_peak[a], p4.activations_at_peak[b]));
            o.in_flight.push_back(p4.in_flight[b]);
        }
        std::map<std::string, double> phases;
        for (const auto& [key, x] : p3.phases[a])
            if (auto it = p4.phases[b].find(key); it != p4.phases[b].end()) phases[key] = held(x, it->second);
        o.phases.push_back(std::move(phases));
        o.tail.push_back(lin(p3.tail[a], p4.tail[b]));
        o.fb_compute.push_back(lin(p3.fb_compute[a], p4.fb_compute[b]));
        o.fb_overlap.push_back(lin(p3.fb_overlap[a], p4.fb_overlap[b]));
        o.tail_compute.push_back(lin(p3.tail_compute[a], p4.tail_compute[b]));
        o.tail_overlap.push_back(lin(p3.tail_overlap[a], p4.tail_overlap[b]));
    }
    o.fb_comm = comm_extrapolated(p3.fb_comm, p4.fb_comm, d);
    o.tail_comm = comm_extrapolated(p3.tail_comm, p4.tail_comm, d);
    return o;
}

std::vector<int> balance_blocks(int total, const std::vector<double>& extra, double per_block) {
    const int stages = static_cast<int>(extra.size());
    PTOOL_REQUIRE(stages >= 1 && total >= stages, "{} blocks over {} stages", total, stages);
    // at least the 2 blocks a stage was sampled with where the blocks allow (below them a stage's
    // costs would be extrapolated, not interpolated), else 1
    std::vector<int> n(stages, least_stage_blocks(total, stages));
    for (int left = total - n[0] * stages; left > 0; --left) {  // the next block to the stage it slows least
        int best = 0;
        for (int s = 1; s < stages; ++s)
            if (extra[s] + (n[s] + 1) * per_block < extra[best] + (n[best] + 1) * per_block - 1e-15) best = s;
        ++n[best];
    }
    return n;
}

int least_stage_blocks(int total, int stages) {
    return total >= 2 * stages ? 2 : 1;
}

PipelineTiming time_schedule(const Schedule& schedule, const PipelineSample& costs) {
    std::vector<TimedList> lists(schedule.ranks.size());
    for (size_t r = 0; r < schedule.ranks.size(); ++r) {
        const std::vector<Action>& list = schedule.ranks[r];
        TimedList& out = lists[r];
        out.actions = list;
        out.seconds.reserve(list.size());
        for (size_t i = 0; i < list.size(); ++i) {
            const Action& a = list[i];
            if (!a.is_p2p() || i == 0 || !list[i - 1].is_p2p())  // a batch of transfers is one entry
                out.first.push_back(static_cast<uint32_t>(i));
            out.seconds.push_back(a.is_p2p()                              ? costs.transfer
                                  : a.kind == ActionKind::forward         ? costs.forward.at(a.stage)
                                  : a.kind == ActionKind::backward        ? costs.backward.at(a.stage)
                                  : a.kind == ActionKind::backward_input  ? costs.split(a.stage).first
                                  : a.kind == ActionKind::backward_weight ? costs.split(a.stage).second
                                  : a.kind == ActionKind::grad_sync       ? costs.tail.at(r)
                                                                          : 0.0);
        }
        out.first.push_back(static_cast<uint32_t>(list.size()));
    }
    return pipeline_critical_path(lists);
}

PipelineTiming time_pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds, int v,
                                      const PipelineSample& costs, int64_t exact) {
    auto play = [&](int m) { return time_schedule(pipeline_schedule(kind, stages, m, rounds, v), costs); };
    const int pp = stages / v;
    const int64_t size = static_cast<int64_t>(stages) * microbatches * rounds;
    if (size <= exact || microbatches % pp != 0) return play(microbatches);
    int M = 4 * pp;  // the largest multiple of pp from 4 pp whose third play stays within `exact`
    while (static_cast<int64_t>(stages) * (2 * M + 2 * pp) * rounds <= exact) M *= 2;
    if (M + 2 * pp >= microbatches) return play(microbatches);
    const PipelineTiming a = play(M), b = play(M + pp), c = play(M + 2 * pp);
    auto steady = [](double x, double y, double z) {
        return std::abs((z - y) - (y - x)) <=
               1e-9 * std::max({std::abs(x), std::abs(y), std::abs(z), 1e-300});
    };
    bool linear = steady(a.step, b.step, c.step) && steady(a.pipelined, b.pipelined, c.pipelined);
    for (size_t r = 0; r < a.busy.size() && linear; ++r)
        linear = steady(a.busy[r], b.busy[r], c.busy[r]) && steady(a.finish[r], b.finish[r], c.finish[r]);
    if (!linear) return play(microbatches);
    // a steady state that still drifts (torch's receives waited for at their consumer let a rank run
    // ahead and fall back over many periods): the line must also reach the play of 2M
    if (2 * M < microbatches) {
        const PipelineTiming d = play(2 * M);
        const double periods = static_cast<double>(M) / pp;
        auto reaches = [&](double x, double y, double z) {
            return std::abs(x + (y - x) * periods - z) <= 1e-9 * std::max({std::abs(x), std::abs(z), 1e-300});
        };
        bool on_line = reaches(a.step, b.step, d.step) && reaches(a.pipelined, b.pipelined, d.pipelined);
        for (size_t r = 0; r < a.busy.size() && on_line; ++r)
            on_line =
                reaches(a.busy[r], b.busy[r], d.busy[r]) && reaches(a.finish[r], b.finish[r], d.finish[r]);
        if (!on_line) return play(microbatches);
    }
    const double k = static_cast<double>(microbatches - M) / pp;  // periods beyond the first play
    auto ext = [k](double x, double y) { return x + (y - x) * k; };
    PipelineTiming out = a;
    out.step = ext(a.step, b.step), out.pipelined = ext(a.pipelined, b.pipelined);
    for (size_t r = 0; r < a.busy.size(); ++r)
        out.busy[r] = ext(a.busy[r], b.busy[r]), out.finish[r] = ext(a.finish[r], b.finish[r]);
    const double work = *std::max_element(out.busy.begin(), out.busy.end());
    out.bubble = work > 0 ? (out.pipelined - work) / work : 0;
    return out;
}

}  // namespace ptool
