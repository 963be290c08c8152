#include "train/schedule.h"

#include <algorithm>
#include <map>

namespace ptool {

const char* action_kind_name(ActionKind k) {
    switch (k) {
        case ActionKind::forward:
            return "F";
        case ActionKind::backward:
            return "B";
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

bool Action::is_p2p() const {
    return kind == ActionKind::send_forward || kind == ActionKind::recv_forward ||
           kind == ActionKind::send_backward || kind == ActionKind::recv_backward;
}

std::string Action::str() const {
    if (kind == ActionKind::grad_sync || kind == ActionKind::clip || kind == ActionKind::optimizer_step)
        return action_kind_name(kind);
    return fmt::format("{}{}@{}", action_kind_name(kind), microbatch, stage);
}

int p2p_tag(const Action& a) {
    const bool forward = a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_forward;
    return 2 * a.microbatch + (forward ? 0 : 1);
}

namespace {

void step_end(std::vector<Action>& out) {
    out.push_back({ActionKind::grad_sync});
    out.push_back({ActionKind::clip});
    out.push_back({ActionKind::optimizer_step});
}

// A stage's forward of m with the receive before it and the send after it, or its backward.
void add_forward(std::vector<Action>& out, int s, int stages, int m) {
    if (s > 0) out.push_back({ActionKind::recv_forward, s, m});
    out.push_back({ActionKind::forward, s, m});
    if (s + 1 < stages) out.push_back({ActionKind::send_forward, s, m});
}

void add_backward(std::vector<Action>& out, int s, int stages, int m) {
    if (s + 1 < stages) out.push_back({ActionKind::recv_backward, s, m});
    out.push_back({ActionKind::backward, s, m});
    if (s > 0) out.push_back({ActionKind::send_backward, s, m});
}

}  // namespace

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

Schedule pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds) {
    PTOOL_REQUIRE(stages >= 1 && microbatches >= 1 && rounds >= 1,
                  "a schedule of {} stages, {} microbatches and {} rounds", stages, microbatches, rounds);
    if (kind == ScheduleKind::accumulation) {
        PTOOL_REQUIRE(stages == 1, "the accumulation schedule has one stage, not {}", stages);
        return accumulation_schedule(microbatches * rounds);
    }
    PTOOL_REQUIRE(kind != ScheduleKind::interleaved_one_f_one_b, "interleaved_1f1b is not built");
    Schedule sch;
    sch.kind = kind, sch.stages = stages, sch.microbatches = microbatches * rounds;
    sch.ranks.resize(stages);
    for (int s = 0; s < stages; ++s) {
        std::vector<Action>& out = sch.ranks[s];
        for (int r = 0; r < rounds; ++r) {  // gradient accumulation: one schedule after the other
            const int o = r * microbatches;
            if (kind == ScheduleKind::gpipe) {
                for (int m = 0; m < microbatches; ++m) add_forward(out, s, stages, o + m);
                for (int m = 0; m < microbatches; ++m) add_backward(out, s, stages, o + m);
            } else {  // 1f1b: warm up with stages - s forwards, then one backward and one forward, then drain
                const int warmup = std::min(stages - s, microbatches);
                int f = 0, b = 0;
                while (f < warmup) add_forward(out, s, stages, o + f++);
                while (f < microbatches)
                    add_backward(out, s, stages, o + b++), add_forward(out, s, stages, o + f++);
                while (b < microbatches) add_backward(out, s, stages, o + b++);
            }
        }
        step_end(out);
    }
    return sch;
}

namespace {

[[noreturn]] void bad(const Schedule& s, int rank, const std::string& what) {
    throw RuntimeError(fmt::format("schedule {} ({} stages, {} microbatches): rank {} (stage {}) {}",
                                   schedule_kind_name(s.kind), s.stages, s.microbatches, rank, rank, what));
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

// Every rank's list: each microbatch once each way, in order, with its receives before and sends after.
void check_structure(const Schedule& s) {
    if (static_cast<int>(s.ranks.size()) != s.stages)
        bad(s, 0, fmt::format("is one of {} lists", s.ranks.size()));
    for (int r = 0; r < s.stages; ++r) {
        const std::vector<Action>& list = s.ranks[r];
        std::map<std::pair<ActionKind, int>, int> at;  // (kind, microbatch) -> index
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
            if (a.stage != r) bad(s, r, fmt::format("runs {}, an action of stage {}", a.str(), a.stage));
            if (a.microbatch < 0 || a.microbatch >= s.microbatches)
                bad(s, r, fmt::format("runs {}: no such microbatch", a.str()));
            if (!at.emplace(std::make_pair(a.kind, a.microbatch), i).second)
                bad(s, r, fmt::format("runs {} twice", a.str()));
            if (a.kind == ActionKind::backward) last_backward = i;
        }
        if (end_actions != 3) bad(s, r, "does not end with the gradient sync, clip and optimizer step");
        auto index = [&](ActionKind k, int m) {
            auto it = at.find({k, m});
            return it == at.end() ? -1 : it->second;
        };
        const bool first = r == 0, last = r + 1 == s.stages;
        for (int m = 0; m < s.microbatches; ++m) {
            const int f = index(ActionKind::forward, m), b = index(ActionKind::backward, m);
            if (f < 0) bad(s, r, fmt::format("never runs F{}", m));
            if (b < 0) bad(s, r, fmt::format("never runs B{}", m));
            if (b < f) bad(s, r, fmt::format("runs B{} before F{}", m, m));
            auto expect = [&](bool needed, ActionKind k, bool before, int anchor, const char* what) {
                const int i = index(k, m);
                if (!needed) {
                    if (i >= 0)
                        bad(s, r,
                            fmt::format("runs {}{}, which its stage has no peer for", action_kind_name(k),
                                        m));
                    return;
                }
                if (i < 0) bad(s, r, fmt::format("never runs {}{} ({})", action_kind_name(k), m, what));
                if (before ? i > anchor : i < anchor)
                    bad(s, r,
                        fmt::format("runs {}{} {} {}{}", action_kind_name(k), m, before ? "after" : "before",
                                    action_kind_name(list[anchor].kind), m));
            };
            expect(!first, ActionKind::recv_forward, true, f, "the stage's input");
            expect(!last, ActionKind::send_forward, false, f, "the stage's output");
            expect(!last, ActionKind::recv_backward, true, b, "the output's gradient");
            expect(!first, ActionKind::send_backward, false, b, "the input's gradient");
        }
    }
}

// Plays the lists against each other: compute actions complete at once; a rank's run of
// consecutive p2p actions is one batch, each op of which completes when the peer has the matching
// op in the batch it is in now; a batch ends when all its ops have.
void check_progress(const Schedule& s) {
    const int n = s.stages;
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
                const int peer = want.stage;
                if (peer < 0 || peer >= n || pos[peer] == s.ranks[peer].size() ||
                    !s.ranks[peer][pos[peer]].is_p2p()) {
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
                                                a.str(), a.microbatch, p2p_tag(a), partner(a).stage));
                    break;
                }
    if (!stuck.empty())
        throw RuntimeError(
            fmt::format("schedule {} ({} stages, {} microbatches) cannot finish: its sends and receives "
                        "never meet: {}",
                        schedule_kind_name(s.kind), s.stages, s.microbatches, fmt::join(stuck, "; ")));
}

}  // namespace

void check_schedule(const Schedule& s) {
    check_structure(s);
    check_progress(s);
}

}  // namespace ptool
