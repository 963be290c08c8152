#include "train/zero_bubble_schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "train/schedule_ops.h"

namespace ptool {
namespace {

using Lists = std::vector<std::vector<Action>>;  // per rank, compute actions only

Action act(ActionKind k, int stage, int m) {
    return {k, stage, m};
}

// One rank of ScheduleInterleavedZeroBubble: _calculate_single_rank_operations with
// _get_warmup_ops(multiply_factor=1) and _get_1f1b_rank_ops(num_1f1b_microbatches=rank,
// enable_zero_bubble=True), its None slots left out.
std::vector<Action> zero_bubble_rank(int r, int pp, int v, int m) {
    const InterleavedRankOps rank(r, pp, v, m, 1);
    const int ops = rank.ops, warmup = rank.warmup;
    std::vector<int> next_f(static_cast<size_t>(v * pp), 0), next_i = next_f, next_w = next_f;
    std::vector<int> backward_ops;  // the op of each I, in order: the Ws follow them
    size_t weights = 0;
    std::vector<Action> out;
    auto add_weight = [&] {
        const int s = rank.backward_stage(backward_ops[weights++]);
        out.push_back(act(ActionKind::backward_weight, s, next_w[s]++));
    };
    for (int op = 0; op < ops + warmup; ++op) {  // warmup, then fwd_bwd = ops - warmup, cooldown = warmup
        if (op < ops) {
            const int s = rank.forward_stage(op);
            out.push_back(act(ActionKind::forward, s, next_f[s]++));
        }
        if (op < warmup) continue;
        const int s = rank.backward_stage(op);
        out.push_back(act(ActionKind::backward_input, s, next_i[s]++));
        backward_ops.push_back(op);
        if (op - warmup >= r) add_weight();  // num_1f1b_microbatches = rank Is pending
    }
    while (weights < backward_ops.size()) add_weight();
    return out;
}

// One rank of ScheduleZBVZeroBubble._calculate_single_rank_operations: it generates
// max(2 pp - 1, m) microbatches and drops those past m (torch turns them into None).
std::vector<Action> zbv_rank(int r, int pp, int m) {
    const int n = std::max(2 * pp - 1, m), c0 = r, c1 = 2 * pp - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    std::vector<Action> out;
    auto add = [&](ActionKind k, int stage, int mb) {
        if (mb < m) out.push_back(act(k, stage, mb));
    };
    auto iw = [&](int stage, int& b) {  // I and W of the same microbatch
        add(ActionKind::backward_input, stage, b), add(ActionKind::backward_weight, stage, b), ++b;
    };
    for (int k = 0; k < 2 * (pp - r) - 1; ++k) add(ActionKind::forward, c0, f0++);  // warmup_n1
    for (int k = 0; k < r; ++k)                                                     // warmup_n2
        add(ActionKind::forward, c1, f1++), add(ActionKind::forward, c0, f0++);
    for (int k = 0; k < pp - r; ++k) add(ActionKind::forward, c1, f1++), iw(c1, b1);  // warmup_n3
    while (f1 < f0 || f0 < n) {                                                       // stable phase
        if (f0 < n) add(ActionKind::forward, c0, f0++);
        iw(c0, b0);
        add(ActionKind::forward, c1, f1++);
        iw(c1, b1);
    }
    int w0 = b0, w1 = b1;        // cooldown: Ws deferred
    for (int k = 0; k < r; ++k)  // cooldown_n1
        add(ActionKind::backward_input, c0, b0++), add(ActionKind::backward_input, c1, b1++);
    for (int k = 0; k < pp - r; ++k)  // cooldown_n2
        add(ActionKind::backward_input, c0, b0++), add(ActionKind::backward_weight, c0, w0++);
    while (w1 < b1) add(ActionKind::backward_weight, c1, w1++);
    while (w0 < b0) add(ActionKind::backward_weight, c0, w0++);
    PTOOL_REQUIRE(w0 == b0 && b0 == f0 && w1 == b1 && b1 == f1, "ZBV rank {}: F, I and W counts differ", r);
    return out;
}

// One rank of ScheduleDualPipeV._calculate_single_rank_operations, its counters per (stage, kind)
// as torch keeps them: a B takes its microbatch from the I counter and bumps the I and W counters;
// an I queues its W, which add_weight_action_if_pending later runs, oldest first.
class DualPipeVRank {
public:
    DualPipeVRank(int r, int pp, int m) : r_(r), pp_(pp), m_(m), s0_(r), s1_(2 * pp - 1 - r) {}

    std::vector<Action> build() {
        const int r = r_, pp = pp_;
        for (int k = 0; k < 2 * (pp - r - 1); ++k) add(s0_, ActionKind::forward);  // step 1: F0
        for (int k = 0; k < r + 1; ++k) add(s0_, ActionKind::forward), add(s1_, ActionKind::forward);
        for (int k = 0; k < pp - r - 1; ++k)  // step 3: I1 W1 F1
            add(s1_, ActionKind::backward_input), weight_if_pending(), add(s1_, ActionKind::forward);
        for (int i = 0; i < m_ - 2 * pp + r + 1; ++i) {  // step 4 (main): F0B1 F1B0
            if (i == 0 && r == pp - 1)  // "don't overlap these two chunks to further reduce bubble size"
                add(s0_, ActionKind::forward), add(s1_, ActionKind::backward);
            else
                overlap(s0_, s1_);
            overlap(s1_, s0_);
        }
        for (int k = 0; k < pp - r - 1; ++k) add(s1_, ActionKind::backward), overlap(s1_, s0_);  // step 5
        const int step6 = r + 1;  // step 6: B1 B0, the second half zero bubble
        bool zb = false;
        for (int i = 0; i < step6; ++i) {
            if (i == step6 / 2 && r % 2 == 1) zb = true;
            add(s1_, zb ? ActionKind::backward_input : ActionKind::backward);
            if (i == step6 / 2 && r % 2 == 0) zb = true;
            add(s0_, zb ? ActionKind::backward_input : ActionKind::backward);
        }
        for (int k = 0; k < pp - r - 1; ++k)  // step 7: W B0
            weight_if_pending(), add(s0_, zb ? ActionKind::backward_input : ActionKind::backward);
        for (int k = 0; k < r + 1; ++k) weight_if_pending();  // step 8: W
        return std::move(out_);
    }

private:
    int& count(int stage, ActionKind k) { return counters_[{stage, k}]; }
    void backward_done(int stage) {
        ++count(stage, ActionKind::backward_input), ++count(stage, ActionKind::backward_weight);
    }
    void add(int stage, ActionKind k) {
        const int mb = count(stage, k == ActionKind::backward ? ActionKind::backward_input : k);
        out_.push_back(act(k, stage, mb));
        if (k == ActionKind::backward) return backward_done(stage);
        if (k == ActionKind::backward_input) weights_.push_back({stage, mb});
        ++count(stage, k);
    }
    void overlap(int fs, int bs) {  // OVERLAP_F_B(F(fs), B(bs)): the F marked, then the B
        Action f = act(ActionKind::forward, fs, count(fs, ActionKind::forward)++);
        f.overlapped = true;
        out_.push_back(f);
        out_.push_back(act(ActionKind::backward, bs, count(bs, ActionKind::backward_input)));
        backward_done(bs);
    }
    void weight_if_pending() {
        if (weights_.empty()) return;
        const auto [stage, mb] = weights_.front();
        weights_.erase(weights_.begin());
        out_.push_back(act(ActionKind::backward_weight, stage, mb));
        ++count(stage, ActionKind::backward_weight);
    }

    int r_, pp_, m_, s0_, s1_;
    std::map<std::pair<int, ActionKind>, int> counters_;
    std::vector<std::pair<int, int>> weights_;  // torch's weight_queue: (stage, microbatch)
    std::vector<Action> out_;
};

using Key = std::tuple<ActionKind, int, int>;

Key key(ActionKind k, int stage, int m) {
    return {k, stage, m};
}

// torch's _add_send_recv over the compute lists: ranks in turn place their next action once its
// input is there (a forward's: RECV_F or the local F of the stage before; an I's or B's: RECV_B or
// the local I or B of the stage after), its send right after it and the peer's receive appended to
// the peer's list at that moment; an overlapped F and its B are placed together, their sends after
// both. Then each rank's SYNC CLIP STEP.
void add_send_recv(Schedule& sch, const Lists& compute) {
    const size_t n = compute.size();
    std::vector<size_t> pos(n, 0);
    std::vector<std::set<Key>> placed(n);
    auto ready = [&](const Action& a, size_t r) {
        const std::set<Key>& p = placed[r];
        const int s = a.stage, m = a.microbatch;
        if (a.kind == ActionKind::forward && s != 0)
            return p.count(key(ActionKind::recv_forward, s, m)) ||
                   p.count(key(ActionKind::forward, s - 1, m));
        if ((a.kind == ActionKind::backward_input || a.kind == ActionKind::backward) && s != sch.stages - 1)
            return p.count(key(ActionKind::recv_backward, s, m)) ||
                   p.count(key(ActionKind::backward_input, s + 1, m)) ||
                   p.count(key(ActionKind::backward, s + 1, m));
        return true;
    };
    auto place = [&](size_t r, const Action& a) {
        sch.ranks[r].push_back(a);
        placed[r].insert(key(a.kind, a.stage, a.microbatch));
    };
    for (bool left = true; left;) {
        bool progress = false;
        left = false;
        for (size_t r = 0; r < n; ++r) {
            if (pos[r] == compute[r].size()) continue;
            const size_t len = compute[r][pos[r]].overlapped ? 2 : 1;
            const auto unit = compute[r].begin() + static_cast<std::ptrdiff_t>(pos[r]);
            if (!std::all_of(unit, unit + static_cast<std::ptrdiff_t>(len),
                             [&](const Action& a) { return ready(a, r); })) {
                left = true;
                continue;
            }
            for (size_t k = 0; k < len; ++k) place(r, unit[k]);
            for (size_t k = 0; k < len; ++k) {
                const Action& a = unit[k];
                const bool f = a.kind == ActionKind::forward;
                if (f ? !sch.sends_output(a.stage)
                      : !a.is_backward() || a.kind == ActionKind::backward_weight ||
                            !sch.receives_input(a.stage))
                    continue;
                const Action send{f ? ActionKind::send_forward : ActionKind::send_backward, a.stage,
                                  a.microbatch};
                place(r, send);
                const Action recv = p2p_partner(send);
                place(static_cast<size_t>(sch.rank_of(recv.stage)), recv);
            }
            pos[r] += len, progress = true;
            left = left || pos[r] < compute[r].size();
        }
        if (left && !progress) {
            std::vector<std::string> heads;
            for (size_t r = 0; r < n; ++r)
                if (pos[r] < compute[r].size())
                    heads.push_back(fmt::format("rank {} at {}", r, compute[r][pos[r]].str()));
            throw RuntimeError(
                fmt::format("{}: no rank's next action has its input (torch: \"Malformed compute "
                            "schedule, can't schedule sends/recvs\"): {}",
                            sch.torch_name, fmt::join(heads, "; ")));
        }
    }
    for (std::vector<Action>& list : sch.ranks) step_end(list);
}

Schedule lowered(const char* name, int pp, int v, int m, std::vector<int> stage_rank, const Lists& compute,
                 ScheduleKind kind) {
    Schedule sch;
    sch.torch_name = name, sch.kind = kind;
    sch.stages = pp * v, sch.microbatches = m, sch.stage_rank = std::move(stage_rank);
    sch.ranks.resize(static_cast<size_t>(pp));
    add_send_recv(sch, compute);
    return sch;
}

void require_sizes(const char* name, int pp, int v, int m) {
    if (pp < 1 || v < 1 || m < 1)
        throw InputError(fmt::format("{}: {} ranks of {} stages, {} microbatches", name, pp, v, m));
}

}  // namespace

std::vector<int> v_stage_rank(int pp) {
    std::vector<int> out(static_cast<size_t>(2 * pp));
    for (int s = 0; s < 2 * pp; ++s) out[static_cast<size_t>(s)] = s < pp ? s : 2 * pp - 1 - s;
    return out;
}

Schedule interleaved_zero_bubble_schedule(int pp, int v, int m) {
    require_sizes("InterleavedZeroBubble", pp, v, m);
    const int rounds = std::max(1, m / pp);
    if (m % rounds != 0)
        throw InputError(
            fmt::format("InterleavedZeroBubble: zero bubble requires the number of microbatches to "
                        "be a multiple of the number of rounds ({}), but got {}",
                        rounds, m));
    Lists compute;
    for (int r = 0; r < pp; ++r) compute.push_back(zero_bubble_rank(r, pp, v, m));
    return lowered("InterleavedZeroBubble", pp, v, m, loop_stage_rank(pp, pp * v), compute,
                   ScheduleKind::zero_bubble);
}

Schedule zbv_zero_bubble_schedule(int pp, int v, int m) {
    require_sizes("ZBVZeroBubble", pp, v, m);
    if (v != 2)
        throw InputError(fmt::format("ZBVZeroBubble: ZBV requires exactly 2 stages per rank, got {}", v));
    Lists compute;
    for (int r = 0; r < pp; ++r) compute.push_back(zbv_rank(r, pp, m));
    return lowered("ZBVZeroBubble", pp, v, m, v_stage_rank(pp), compute, ScheduleKind::zbv);
}

Schedule dualpipev_schedule(int pp, int v, int m) {
    require_sizes("DualPipeV", pp, v, m);
    if (v != 2) throw InputError(fmt::format("DualPipeV: ZBV requires exactly 2 stages per rank, got {}", v));
    if (m < 2 * pp)
        throw InputError(
            fmt::format("DualPipeV: DualPipeV requires at least as many microbatches as stages, but "
                        "got {} microbatches and {} stages",
                        m, 2 * pp));
    Lists compute;
    for (int r = 0; r < pp; ++r) compute.push_back(DualPipeVRank(r, pp, m).build());
    return lowered("DualPipeV", pp, v, m, v_stage_rank(pp), compute, ScheduleKind::dualpipev);
}

}  // namespace ptool
