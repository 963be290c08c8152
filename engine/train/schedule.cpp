#include "train/schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "train/schedule_ops.h"
#include "train/zero_bubble_schedule.h"

namespace ptool {

const char* action_kind_name(ActionKind k) {
    switch (k) {
        case ActionKind::forward:
            return "F";
        case ActionKind::backward:
            return "B";
        case ActionKind::backward_input:
            return "I";
        case ActionKind::backward_weight:
            return "W";
        case ActionKind::send_forward:
            return "SEND_F";
        case ActionKind::recv_forward:
            return "RECV_F";
        case ActionKind::send_backward:
            return "SEND_B";
        case ActionKind::recv_backward:
            return "RECV_B";
        case ActionKind::grad_sync:
            return "SYNC";
        case ActionKind::clip:
            return "CLIP";
        case ActionKind::optimizer_step:
            return "STEP";
    }
    return "?";
}

std::string Action::str() const {
    if (kind == ActionKind::grad_sync || kind == ActionKind::clip || kind == ActionKind::optimizer_step)
        return action_kind_name(kind);
    return fmt::format("{}{}@{}", action_kind_name(kind), microbatch, stage);
}

int p2p_tag(const Action& a) {
    const bool forward = a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_forward;
    const bool sends_up = a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_backward;
    const int64_t m = a.microbatch, b = sends_up ? a.stage : a.stage - 1;  // the boundary crossed
    const int64_t pair = (m + b) * (m + b + 1) / 2 + b;                    // Cantor: one per (m, b)
    const int64_t tag = 2 * pair + (forward ? 0 : 1);
    PTOOL_REQUIRE(m >= 0 && b >= 0 && tag <= std::numeric_limits<int>::max(), "no tag for {}", a.str());
    return static_cast<int>(tag);
}

std::vector<int> Schedule::stages_of(int rank) const {
    std::vector<int> out;
    for (int s = 0; s < stages; ++s)
        if (rank_of(s) == rank) out.push_back(s);
    return out;
}

namespace {

// A stage's forward of m with the receive before it and the send after it, or its backward (no
// send or receive where the neighbouring stage is on the same rank).
void add_forward(std::vector<Action>& out, const Schedule& sch, int s, int m) {
    if (sch.receives_input(s)) out.push_back({ActionKind::recv_forward, s, m});
    out.push_back({ActionKind::forward, s, m});
    if (sch.sends_output(s)) out.push_back({ActionKind::send_forward, s, m});
}

void add_backward(std::vector<Action>& out, const Schedule& sch, int s, int m) {
    if (sch.sends_output(s)) out.push_back({ActionKind::recv_backward, s, m});
    out.push_back({ActionKind::backward, s, m});
    if (sch.receives_input(s)) out.push_back({ActionKind::send_backward, s, m});
}

// One round of interleaved 1F1B on pipeline rank r, its microbatches from o, as units of compute:
// torch's ScheduleInterleaved1F1B._calculate_single_rank_operations (_get_1f1b_rank_ops with
// _get_warmup_ops): a forward per warmup unit, a forward and a backward per 1F1B unit, a backward
// per cooldown unit.
void add_interleaved_round(std::vector<std::vector<Action>>& units, int r, int pp, int v, int m, int o) {
    const InterleavedRankOps rank(r, pp, v, m, 2);
    std::vector<int> next_forward(static_cast<size_t>(v * pp), 0), next_backward = next_forward;
    auto forward = [&](int k) -> Action {
        const int s = rank.forward_stage(k);
        return {ActionKind::forward, s, o + next_forward[s]++};
    };
    auto backward = [&](int k) -> Action {
        const int s = rank.backward_stage(k);
        return {ActionKind::backward, s, o + next_backward[s]++};
    };
    for (int k = 0; k < rank.warmup; ++k) units.push_back({forward(k)});
    for (int k = rank.warmup; k < rank.ops; ++k) units.push_back({forward(k), backward(k)});
    for (int k = rank.ops; k < rank.ops + rank.warmup; ++k) units.push_back({backward(k)});
}

// Units of compute with their sends and receives as Megatron-Core posts them: between two units one
// batch with the sends of the unit before (its outputs, its inputs' gradients) and the receives of
// the unit after (send_forward_backward_recv_forward_backward), so that no rank waits in a send
// while its peer waits in one too (rendezvous sends placed next to each compute deadlock here).
void add_units(std::vector<Action>& out, const Schedule& sch, const std::vector<std::vector<Action>>& units) {
    std::vector<Action> sends;
    for (const std::vector<Action>& unit : units) {
        std::vector<Action> batch = sends, next;
        for (const Action& a : unit) {
            const bool f = a.kind == ActionKind::forward;
            if (f ? sch.receives_input(a.stage) : sch.sends_output(a.stage))
                batch.push_back(
                    {f ? ActionKind::recv_forward : ActionKind::recv_backward, a.stage, a.microbatch});
            if (f ? sch.sends_output(a.stage) : sch.receives_input(a.stage))
                next.push_back(
                    {f ? ActionKind::send_forward : ActionKind::send_backward, a.stage, a.microbatch});
        }
        out.insert(out.end(), batch.begin(), batch.end());
        out.insert(out.end(), unit.begin(), unit.end());
        sends = std::move(next);
    }
    out.insert(out.end(), sends.begin(), sends.end());
}

}  // namespace

void step_end(std::vector<Action>& out) {
    out.push_back({ActionKind::grad_sync});
    out.push_back({ActionKind::clip});
    out.push_back({ActionKind::optimizer_step});
}

std::vector<int> loop_stage_rank(int pp, int stages) {
    std::vector<int> out(static_cast<size_t>(stages));
    for (int s = 0; s < stages; ++s) out[static_cast<size_t>(s)] = s % pp;
    return out;
}

std::vector<int> stage_placement(ScheduleKind kind, int pp, int stages) {
    if (!v_placed(kind)) return loop_stage_rank(pp, stages);
    PTOOL_REQUIRE(stages == 2 * pp, "{}: {} stages on {} ranks", schedule_kind_name(kind), stages, pp);
    return v_stage_rank(pp);
}

Schedule accumulation_schedule(int microbatches) {
    Schedule s;
    s.kind = ScheduleKind::accumulation, s.stages = 1, s.microbatches = microbatches;
    s.ranks.resize(1);
    for (int m = 0; m < microbatches; ++m) {
        s.ranks[0].push_back({ActionKind::forward, 0, m});
        s.ranks[0].push_back({ActionKind::backward, 0, m});
    }
    step_end(s.ranks[0]);
    return s;
}

Schedule pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds, int virtual_stages) {
    PTOOL_REQUIRE(stages >= 1 && microbatches >= 1 && rounds >= 1 && virtual_stages >= 1,
                  "a schedule of {} stages, {} microbatches, {} rounds and {} virtual stages", stages,
                  microbatches, rounds, virtual_stages);
    if (kind == ScheduleKind::accumulation) {
        PTOOL_REQUIRE(stages == 1, "the accumulation schedule has one stage, not {}", stages);
        return accumulation_schedule(microbatches * rounds);
    }
    if (splits_backward(kind)) {  // torch's order of one round, run once per round
        PTOOL_REQUIRE(stages % virtual_stages == 0, "{}: {} stages in {} per rank", schedule_kind_name(kind),
                      stages, virtual_stages);
        const int pp = stages / virtual_stages;
        Schedule sch = kind == ScheduleKind::zbv ? zbv_zero_bubble_schedule(pp, virtual_stages, microbatches)
                       : kind == ScheduleKind::dualpipev
                           ? dualpipev_schedule(pp, virtual_stages, microbatches)
                           : interleaved_zero_bubble_schedule(pp, virtual_stages, microbatches);
        // gradient accumulation as torchtitan runs it under pp: the schedule's step once per round
        // (each its own fill and drain), the microbatches numbered on, one sync, clip and step
        for (std::vector<Action>& list : sch.ranks) {
            list.resize(list.size() - 3);  // the round's sync, clip and step
            const size_t round = list.size();
            for (int r = 1; r < rounds; ++r)
                for (size_t i = 0; i < round; ++i) {
                    Action a = list[i];
                    a.microbatch += r * microbatches;
                    list.push_back(a);
                }
            step_end(list);
        }
        sch.microbatches = microbatches * rounds;
        return sch;
    }
    const bool interleaved = kind == ScheduleKind::interleaved_one_f_one_b;
    PTOOL_REQUIRE(interleaved || virtual_stages == 1, "{} runs one stage per rank, not {}",
                  schedule_kind_name(kind), virtual_stages);
    PTOOL_REQUIRE(stages % virtual_stages == 0, "{} stages in {} virtual stages per rank", stages,
                  virtual_stages);
    const int pp = stages / virtual_stages;
    PTOOL_REQUIRE(!interleaved || microbatches % std::max(1, microbatches / pp) == 0,
                  "interleaved_1f1b: {} microbatches in rounds of {} pp ranks", microbatches, pp);
    Schedule sch;
    sch.kind = kind, sch.stages = stages, sch.microbatches = microbatches * rounds;
    sch.stage_rank = loop_stage_rank(pp, stages);  // s on s without v
    sch.ranks.resize(pp);
    for (int rank = 0; rank < pp; ++rank) {
        std::vector<Action>& out = sch.ranks[rank];
        const int s = rank;                      // gpipe and 1f1b: the rank's one stage
        std::vector<std::vector<Action>> units;  // interleaved_1f1b's, over every round
        for (int r = 0; r < rounds; ++r) {       // gradient accumulation: one schedule after the other
            const int o = r * microbatches;
            if (interleaved) {
                add_interleaved_round(units, rank, pp, virtual_stages, microbatches, o);
            } else if (kind == ScheduleKind::gpipe) {
                for (int m = 0; m < microbatches; ++m) add_forward(out, sch, s, o + m);
                for (int m = 0; m < microbatches; ++m) add_backward(out, sch, s, o + m);
            } else {  // 1f1b: warm up with stages - s forwards, then one backward and one forward, then drain
                const int warmup = std::min(stages - s, microbatches);
                int f = 0, b = 0;
                while (f < warmup) add_forward(out, sch, s, o + f++);
                while (f < microbatches)
                    add_backward(out, sch, s, o + b++), add_forward(out, sch, s, o + f++);
                while (b < microbatches) add_backward(out, sch, s, o + b++);
            }
        }
        add_units(out, sch, units);
        step_end(out);
    }
    return sch;
}

namespace {

std::string describe(const Schedule& s) {
    const int ranks = static_cast<int>(s.ranks.size());
    const std::string name = s.torch_name.empty() ? schedule_kind_name(s.kind) : s.torch_name;
    return s.stages == ranks
               ? fmt::format("schedule {} ({} stages, {} microbatches)", name, s.stages, s.microbatches)
               : fmt::format("schedule {} ({} stages on {} ranks, {} microbatches)", name, s.stages, ranks,
                             s.microbatches);
}

[[noreturn]] void bad(const Schedule& s, int rank, const std::string& what) {
    std::vector<int> held;
    if (static_cast<int>(s.stage_rank.size()) == s.stages) held = s.stages_of(rank);
    throw ScheduleViolation(fmt::format("{}: rank {} (stage{} {}) {}", describe(s), rank,
                                        held.size() == 1 ? "" : "s", fmt::join(held, ", "), what));
}

}  // namespace

Action p2p_partner(const Action& a) {
    switch (a.kind) {
        case ActionKind::send_forward:
            return {ActionKind::recv_forward, a.stage + 1, a.microbatch};
        case ActionKind::recv_forward:
            return {ActionKind::send_forward, a.stage - 1, a.microbatch};
        case ActionKind::send_backward:
            return {ActionKind::recv_backward, a.stage - 1, a.microbatch};
        default:
            return {ActionKind::send_backward, a.stage + 1, a.microbatch};  // recv_backward
    }
}

namespace {

Action partner(const Action& a) {
    return p2p_partner(a);
}

bool same(const Action& a, const Action& b) {
    return a.kind == b.kind && a.stage == b.stage && a.microbatch == b.microbatch;
}

// Where each stage runs: every stage on one of the ranks, every rank with a stage.
void check_placement(const Schedule& s) {
    const int n = static_cast<int>(s.ranks.size());
    if (s.stages < 1 || n < 1 || n > s.stages)
        throw ScheduleViolation(fmt::format("{}: {} lists for {} stages", describe(s), n, s.stages));
    if (static_cast<int>(s.stage_rank.size()) != s.stages)
        throw ScheduleViolation(
            fmt::format("{}: a placement of {} stages", describe(s), s.stage_rank.size()));
    std::vector<int> count(static_cast<size_t>(n), 0);
    for (int st = 0; st < s.stages; ++st) {
        const int r = s.stage_rank[st];
        if (r < 0 || r >= n)
            throw ScheduleViolation(
                fmt::format("{}: stage {} is placed on rank {}, not one of its {}", describe(s), st, r, n));
        ++count[r];
    }
    for (int r = 0; r < n; ++r)
        if (count[r] == 0) throw ScheduleViolation(fmt::format("{}: rank {} holds no stage", describe(s), r));
}

// One rank's list, indexed: where each (kind, stage, microbatch) of the stages it holds runs (-1:
// not run), once each checked to be an action of one of its stages, of a microbatch of the step,
// run at most once, and the step's end (SYNC CLIP STEP) to come last, after its last backward.
struct RankIndex {
    const Schedule& s;
    int r;
    const std::vector<Action>& list;
    std::vector<int> held, local, at;

    RankIndex(const Schedule& sch, int rank)
        : s(sch), r(rank), list(sch.ranks[rank]), held(sch.stages_of(rank)) {
        local.assign(static_cast<size_t>(s.stages), -1);
        for (size_t h = 0; h < held.size(); ++h) local[static_cast<size_t>(held[h])] = static_cast<int>(h);
        const size_t kinds = static_cast<size_t>(ActionKind::optimizer_step) + 1;
        at.assign(kinds * held.size() * static_cast<size_t>(s.microbatches), -1);
        int end_actions = 0, last_backward = -1;
        for (int i = 0; i < static_cast<int>(list.size()); ++i) {
            const Action& a = list[i];
            if (a.kind == ActionKind::grad_sync || a.kind == ActionKind::clip ||
                a.kind == ActionKind::optimizer_step) {
                const ActionKind want[] = {ActionKind::grad_sync, ActionKind::clip,
                                           ActionKind::optimizer_step};
                if (end_actions > 2 || a.kind != want[end_actions])
                    bad(s, r, fmt::format("has {} out of place", a.str()));
                if (i < last_backward) bad(s, r, fmt::format("runs {} before its last backward", a.str()));
                ++end_actions;
                continue;
            }
            if (a.stage < 0 || a.stage >= s.stages || s.rank_of(a.stage) != r)
                bad(s, r, fmt::format("runs {}, an action of stage {}{}", a.str(), a.stage, holder(a.stage)));
            if (a.microbatch < 0 || a.microbatch >= s.microbatches)
                bad(s, r, fmt::format("runs {}: no such microbatch", a.str()));
            int& seen = at[slot(a.kind, a.stage, a.microbatch)];
            if (seen >= 0) bad(s, r, fmt::format("runs {} twice", a.str()));
            seen = i;
            if (a.is_backward()) last_backward = i;
            const bool pair =
                i + 1 < static_cast<int>(list.size()) && list[i + 1].kind == ActionKind::backward;
            if (a.overlapped && (a.kind != ActionKind::forward || !pair))
                bad(s, r,
                    fmt::format("marks {} overlapped, which is no forward with a backward after it",
                                a.str()));
        }
        if (end_actions != 3) bad(s, r, "does not end with the gradient sync, clip and optimizer step");
    }
    std::string holder(int stage) const {  // ", which rank 0 holds"
        if (stage < 0 || stage >= s.stages) return "";
        return fmt::format(", which rank {} holds", s.rank_of(stage));
    }
    size_t slot(ActionKind k, int stage, int m) const {
        return (static_cast<size_t>(k) * held.size() +
                static_cast<size_t>(local[static_cast<size_t>(stage)])) *
                   static_cast<size_t>(s.microbatches) +
               static_cast<size_t>(m);
    }
    int index(ActionKind k, int stage, int m) const {  // -1: not run, or a stage it does not hold
        if (stage < 0 || stage >= s.stages || local[static_cast<size_t>(stage)] < 0) return -1;
        return at[slot(k, stage, m)];
    }
    // "B0" where the rank holds one stage, "B0@3" where it holds several
    std::string name(ActionKind k, int stage, int m) const {
        return held.size() == 1 ? fmt::format("{}{}", action_kind_name(k), m)
                                : fmt::format("{}{}@{}", action_kind_name(k), m, stage);
    }
    // where the stage's backward of m starts: its B, else its I (-1: neither)
    int input_gradient(int stage, int m) const {
        const int b = index(ActionKind::backward, stage, m);
        return b >= 0 ? b : index(ActionKind::backward_input, stage, m);
    }
};

// A stage's forward of m once, and its backward as one B or as an I and a W (never both), each
// part after the one it needs. Returns where the B or I runs.
int check_compute(const RankIndex& x, int st, int m) {
    const int f = x.index(ActionKind::forward, st, m), b = x.index(ActionKind::backward, st, m);
    const int i = x.index(ActionKind::backward_input, st, m), w = x.index(ActionKind::backward_weight, st, m);
    auto n = [&](ActionKind k) { return x.name(k, st, m); };
    const std::string F = n(ActionKind::forward), B = n(ActionKind::backward),
                      I = n(ActionKind::backward_input), W = n(ActionKind::backward_weight);
    if (f < 0) bad(x.s, x.r, fmt::format("never runs {}", F));
    if (b >= 0 && (i >= 0 || w >= 0)) bad(x.s, x.r, fmt::format("runs {} and {}", B, i >= 0 ? I : W));
    if (b < 0 && i < 0)
        bad(x.s, x.r, w < 0 ? fmt::format("never runs {}", B) : fmt::format("runs {} without {}", W, I));
    if (i >= 0 && w < 0) bad(x.s, x.r, fmt::format("never runs {}", W));
    const int bi = b >= 0 ? b : i;
    if (bi < f) bad(x.s, x.r, fmt::format("runs {} before {}", b >= 0 ? B : I, F));
    if (w >= 0 && w < i) bad(x.s, x.r, fmt::format("runs {} before {}", W, I));
    return bi;
}

// A stage's receive of its input before its forward and send of its output after it, its receive
// of the output's gradient before its B or I and send of the input's gradient after it, where the
// neighbouring stage lives on another rank; where it lives on this one, its forward (or B or I)
// before this stage's.
void check_transfers(const RankIndex& x, int st, int m, int f, int bi) {
    const Schedule& s = x.s;
    auto expect = [&](bool needed, ActionKind k, bool before, int anchor, const char* what) {
        const int i = x.index(k, st, m);
        if (!needed) {
            if (i >= 0)
                bad(s, x.r, fmt::format("runs {}, which its stage has no peer for", x.name(k, st, m)));
            return;
        }
        if (i < 0) bad(s, x.r, fmt::format("never runs {} ({})", x.name(k, st, m), what));
        if (before ? i > anchor : i < anchor)
            bad(s, x.r,
                fmt::format("runs {} {} {}", x.name(k, st, m), before ? "after" : "before",
                            x.name(x.list[anchor].kind, st, m)));
    };
    expect(s.receives_input(st), ActionKind::recv_forward, true, f, "the stage's input");
    expect(s.sends_output(st), ActionKind::send_forward, false, f, "the stage's output");
    expect(s.sends_output(st), ActionKind::recv_backward, true, bi, "the output's gradient");
    expect(s.receives_input(st), ActionKind::send_backward, false, bi, "the input's gradient");
    // a neighbouring stage on this rank hands the input and the output's gradient over
    if (st > 0 && !s.receives_input(st) && x.index(ActionKind::forward, st - 1, m) > f)
        bad(s, x.r, fmt::format("runs F{}@{} before F{}@{}, whose output it takes", m, st, m, st - 1));
    if (st + 1 < s.stages && !s.sends_output(st)) {
        const int next = x.input_gradient(st + 1, m);
        if (next > bi)
            bad(s, x.r,
                fmt::format("runs {}{}@{} before {}{}@{}, whose input's gradient it takes",
                            action_kind_name(x.list[bi].kind), m, st, action_kind_name(x.list[next].kind), m,
                            st + 1));
    }
}

// Each stage's Bs and Ws in microbatch order: a parameter's gradient accumulates microbatch by
// microbatch as the one-stage loop's does (bitwise equal gradients across schedules rest on it).
void check_accumulation_order(const RankIndex& x) {
    std::map<int, const Action*> last;  // stage -> its latest B or W
    for (const Action& a : x.list) {
        if (a.kind != ActionKind::backward && a.kind != ActionKind::backward_weight) continue;
        const Action*& before = last[a.stage];
        if (before && before->microbatch > a.microbatch)
            bad(x.s, x.r,
                fmt::format(
                    "runs {} after {}: its gradient would accumulate out of the one-stage loop's order",
                    a.str(), before->str()));
        before = &a;
    }
}

// Every rank's list: each microbatch's forward and backward once on each of its stages, its
// receives before and sends after (or the local neighbour's action before), its backwards in
// microbatch order.
void check_structure(const Schedule& s) {
    for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r) {
        const RankIndex x(s, r);
        for (int st : x.held)
            for (int m = 0; m < s.microbatches; ++m) {
                const int bi = check_compute(x, st, m);
                check_transfers(x, st, m, x.index(ActionKind::forward, st, m), bi);
            }
        check_accumulation_order(x);
    }
}

// Plays the lists against each other: compute actions complete at once; a rank's run of
// consecutive p2p actions is one batch, each op of which completes when the peer has the matching
// op in the batch it is in now; a batch ends when all its ops have.
void check_progress(const Schedule& s) {
    const int n = static_cast<int>(s.ranks.size());
    std::vector<size_t> pos(n, 0);
    std::vector<std::vector<bool>> done(n);
    for (int r = 0; r < n; ++r) done[r].assign(s.ranks[r].size(), false);
    auto batch_end = [&](int r) {  // one past the rank's current batch
        size_t e = pos[r];
        while (e < s.ranks[r].size() && s.ranks[r][e].is_p2p()) ++e;
        return e;
    };
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < n; ++r) {
            while (pos[r] < s.ranks[r].size() && !s.ranks[r][pos[r]].is_p2p()) ++pos[r], progress = true;
            if (pos[r] == s.ranks[r].size()) continue;
            const size_t end = batch_end(r);
            bool all = true;
            for (size_t i = pos[r]; i < end; ++i) {
                if (done[r][i]) continue;
                const Action want = partner(s.ranks[r][i]);
                const int peer = s.rank_of(want.stage);
                if (pos[peer] == s.ranks[peer].size() || !s.ranks[peer][pos[peer]].is_p2p()) {
                    all = false;
                    continue;
                }
                bool met = false;
                for (size_t j = pos[peer], pe = batch_end(peer); j < pe && !met; ++j)
                    if (!done[peer][j] && same(s.ranks[peer][j], want))
                        done[peer][j] = done[r][i] = met = progress = true;
                all = all && met;
            }
            if (all) pos[r] = end, progress = true;
        }
    }
    std::vector<std::string> stuck;
    for (int r = 0; r < n; ++r)
        if (pos[r] < s.ranks[r].size())
            for (size_t i = pos[r]; i < batch_end(r); ++i)
                if (!done[r][i]) {
                    const Action& a = s.ranks[r][i];
                    stuck.push_back(fmt::format("rank {} waits in {} (microbatch {}, tag {}) for rank {}", r,
                                                a.str(), a.microbatch, p2p_tag(a),
                                                s.rank_of(partner(a).stage)));
                    break;
                }
    if (!stuck.empty())
        throw ScheduleViolation(fmt::format("{} cannot finish: its sends and receives never meet: {}",
                                            describe(s), fmt::join(stuck, "; ")));
}

}  // namespace

void check_schedule(const Schedule& s) {
    check_placement(s);
    check_structure(s);
    check_progress(s);
}

void check_schedule_structure(const Schedule& s) {
    check_placement(s);
    check_structure(s);
}

Schedule unsplit(Schedule s, int stage, int microbatch) {
    auto hit = [&](const Action& a) {
        return a.stage == stage && (microbatch < 0 || a.microbatch == microbatch);
    };
    for (std::vector<Action>& list : s.ranks) {
        std::vector<Action> out;
        out.reserve(list.size());
        for (Action a : list) {
            if (a.kind == ActionKind::backward_weight && hit(a)) continue;
            if (a.kind == ActionKind::backward_input && hit(a)) a.kind = ActionKind::backward;
            out.push_back(a);
        }
        list = std::move(out);
    }
    return s;
}

Schedule checked_pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds,
                                   int virtual_stages) {
    using Key = std::tuple<ScheduleKind, int, int, int, int>;
    static std::mutex mu;
    static std::vector<std::pair<Key, std::shared_ptr<const Schedule>>> kept;  // the last few, newest last
    const Key key{kind, stages, microbatches, rounds, virtual_stages};
    {
        std::lock_guard<std::mutex> lk(mu);
        for (const auto& [k, s] : kept)
            if (k == key) return *s;
    }
    auto s = std::make_shared<const Schedule>(
        pipeline_schedule(kind, stages, microbatches, rounds, virtual_stages));
    check_schedule(*s);
    std::lock_guard<std::mutex> lk(mu);
    if (kept.size() >= 4) kept.erase(kept.begin());
    kept.emplace_back(key, s);
    return *s;
}

}  // namespace ptool
