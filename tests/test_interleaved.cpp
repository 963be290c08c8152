// Interleaved 1F1B (train/schedule.h, train/run.h): pp ranks holding v stages each (stage s on rank
// s mod pp). Its lists follow torch's ScheduleInterleaved1F1B (warmup, 1F1B, cooldown over the
// rank's stages, depth first) with Megatron's batches of sends and receives; check_schedule refuses
// an interleaved order whose rendezvous sends cross; and a run of it over rank threads gives, on
// every rank, bitwise the parameters, gradients, outputs and losses of the one-stage run with the
// same microbatches, but not when a received gradient is perturbed.
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "comm/comm_choice.h"
#include "parallel/device_mesh.h"
#include "parallel/grad_norm.h"
#include "pipeline_cases.h"
#include "test_helpers.h"
#include "train/run.h"
#include "train/schedule.h"

using namespace ptool;

namespace test_interleaved {

namespace {

std::string listed(const std::vector<Action>& list, bool compute_only) {
    std::string s;
    for (const Action& a : list)
        if (!compute_only || a.kind == ActionKind::forward || a.kind == ActionKind::backward)
            s += (s.empty() ? "" : " ") + a.str();
    return s;
}

Schedule interleaved(int pp, int v, int m, int rounds = 1) {
    return pipeline_schedule(ScheduleKind::interleaved_one_f_one_b, pp * v, m, rounds, v);
}

// The properties every interleaved list has: each stage on rank s mod pp, each microbatch forward
// and backward once per stage, in microbatch order; torch's warmup count; unique tags per pair of
// ranks; the last rank's stage sending on to rank 0's next one.
void check_properties(const Schedule& s, int pp, int v, int m, int rounds) {
    INFO("pp " << pp << " v " << v << " " << m << " microbatches x " << rounds << " rounds");
    REQUIRE(static_cast<int>(s.ranks.size()) == pp);
    REQUIRE(s.stages == pp * v);
    CHECK_NOTHROW(check_schedule(s));
    std::set<std::tuple<int, int, int>> sent;  // (from rank, to rank, tag)
    int wraps = 0;
    for (int r = 0; r < pp; ++r) {
        std::vector<int> held;
        for (int k = 0; k < v; ++k) held.push_back(r + k * pp);
        CHECK(s.stages_of(r) == held);
        std::map<std::pair<ActionKind, int>, int> next;  // (kind, stage) -> the next microbatch it runs
        int warmup = 0;
        bool backward_seen = false;
        for (const Action& a : s.ranks[r]) {
            if (a.kind == ActionKind::forward || a.kind == ActionKind::backward) {
                CHECK(s.rank_of(a.stage) == r);
                int& n = next[{a.kind, a.stage}];
                CHECK(a.microbatch == n);  // each stage takes its microbatches in order, both ways
                ++n;
                backward_seen = backward_seen || a.kind == ActionKind::backward;
                if (!backward_seen) ++warmup;
            }
            if (a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward) {
                const int to = s.rank_of(a.kind == ActionKind::send_forward ? a.stage + 1 : a.stage - 1);
                CHECK(sent.insert({r, to, p2p_tag(a)}).second);
                if (a.kind == ActionKind::send_forward && r == pp - 1) {
                    CHECK(to == 0);
                    ++wraps;
                }
            }
        }
        for (int st : held)
            for (ActionKind k : {ActionKind::forward, ActionKind::backward})
                CHECK(next[{k, st}] == m * rounds);
        // torch's warmup forwards, then the first 1F1B unit's forward before its backward
        CHECK(warmup == std::min((v - 1) * pp + 2 * (pp - 1 - r) + 1, v * m));
    }
    if (pp > 1) CHECK(wraps == (v - 1) * m * rounds);  // stage pp-1, 2pp-1, ... sends to rank 0
}

}  // namespace

TEST_CASE("interleaved 1F1B: torch's order over each rank's stages, Megatron's batches", "[cpu][schedule]") {
    const Schedule s = interleaved(2, 2, 4);
    // rank 0 holds stages 0 and 2: 4 warmup forwards (pp microbatches on stage 0, then on stage 2),
    // then a forward and a backward per unit, the backwards from stage 2 down; between two units one
    // batch of the unit before's sends and the unit after's receives
    CHECK(listed(s.ranks[0], true) ==
          "F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0");
    CHECK(listed(s.ranks[1], true) ==
          "F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1");
    CHECK(
        listed(s.ranks[0], false) ==
        "F0@0 SEND_F0@0 F1@0 SEND_F1@0 RECV_F0@2 F0@2 SEND_F0@2 RECV_F1@2 F1@2 SEND_F1@2 RECV_B0@2 F2@0 B0@2 "
        "SEND_F2@0 SEND_B0@2 RECV_B1@2 F3@0 B1@2 SEND_F3@0 SEND_B1@2 RECV_F2@2 RECV_B0@0 F2@2 B0@0 SEND_F2@2 "
        "RECV_F3@2 RECV_B1@0 F3@2 B1@0 SEND_F3@2 RECV_B2@2 B2@2 SEND_B2@2 RECV_B3@2 B3@2 SEND_B3@2 RECV_B2@0 "
        "B2@0 RECV_B3@0 B3@0 SYNC CLIP STEP");
    // the last rank's stage 1 sends to rank 0's stage 2, whose gradient comes back the same way
    CHECK(s.rank_of(2) == 0);
    CHECK(listed(s.ranks[1], false).find("SEND_F0@1 RECV_F1@1") != std::string::npos);
    check_properties(s, 2, 2, 4, 1);
    check_properties(interleaved(4, 2, 4), 4, 2, 4, 1);
    check_properties(interleaved(4, 2, 8), 4, 2, 8, 1);
    check_properties(interleaved(4, 2, 4, 2), 4, 2, 4, 2);
    check_properties(interleaved(2, 4, 6), 2, 4, 6, 1);
    for (int pp : {1, 2, 3, 4, 8})
        for (int v : {1, 2, 3, 4})
            for (int m = pp; m <= 4 * pp; m += pp)
                for (int rounds : {1, 2}) {
                    INFO("pp " << pp << " v " << v << " " << m << " microbatches x " << rounds);
                    CHECK_NOTHROW(check_schedule(interleaved(pp, v, m, rounds)));
                }
    // one rank holding every stage: the stages hand activations and gradients over, nothing is sent
    const Schedule one = interleaved(1, 2, 2);
    // (torch's rounds of max(1, m / pp) microbatches: one microbatch per stage, then the next stage)
    CHECK(listed(one.ranks[0], false) == "F0@0 F0@1 B0@1 F1@0 B0@0 F1@1 B1@1 B1@0 SYNC CLIP STEP");
    // tags: one per microbatch, boundary and direction
    CHECK(p2p_tag({ActionKind::send_forward, 2, 0}) == p2p_tag({ActionKind::recv_forward, 3, 0}));
    CHECK(p2p_tag({ActionKind::send_forward, 0, 0}) != p2p_tag({ActionKind::send_forward, 2, 0}));
    CHECK(p2p_tag({ActionKind::send_backward, 3, 1}) == p2p_tag({ActionKind::recv_backward, 2, 1}));
    std::set<int> tags;
    for (int m = 0; m < 40; ++m)
        for (int b = 0; b < 40; ++b)
            for (ActionKind k : {ActionKind::send_forward, ActionKind::send_backward})
                tags.insert(p2p_tag({k, k == ActionKind::send_forward ? b : b + 1, m}));
    CHECK(tags.size() == 40u * 40u * 2u);
}

TEST_CASE("check_schedule refuses interleaved lists that break placement, order, or cannot finish",
          "[cpu][schedule]") {
    auto refuses = [](const Schedule& s, const std::string& message) {
        INFO(message);
        CHECK_THROWS_WITH(check_schedule(s), Catch::Contains(message));
    };
    // each send and receive right next to its compute (as torch's lists put them, whose runtime
    // sends asynchronously): with rendezvous sends, rank 0 sends B0@2's gradient while rank 1 sends
    // B1@3's, each waiting for the other (pytorch#127332's criss-cross)
    Schedule s = interleaved(2, 2, 4);
    for (int r = 0; r < 2; ++r) {
        std::vector<Action> naive;
        for (const Action& a : s.ranks[r]) {
            if (a.is_p2p()) continue;
            const bool f = a.kind == ActionKind::forward, b = a.kind == ActionKind::backward;
            if (f && s.receives_input(a.stage))
                naive.push_back({ActionKind::recv_forward, a.stage, a.microbatch});
            if (b && s.sends_output(a.stage))
                naive.push_back({ActionKind::recv_backward, a.stage, a.microbatch});
            naive.push_back(a);
            if (f && s.sends_output(a.stage))
                naive.push_back({ActionKind::send_forward, a.stage, a.microbatch});
            if (b && s.receives_input(a.stage))
                naive.push_back({ActionKind::send_backward, a.stage, a.microbatch});
        }
        s.ranks[r] = naive;
    }
    refuses(
        s,
        "schedule interleaved_1f1b (4 stages on 2 ranks, 4 microbatches) cannot finish: its sends and "
        "receives never meet: rank 0 waits in SEND_B0@2 (microbatch 0, tag 5) for rank 1; rank 1 waits in "
        "SEND_B1@3 (microbatch 1, tag 17) for rank 0");
    // an action of a stage the rank does not hold
    s = interleaved(2, 2, 2);
    s.ranks[0].insert(s.ranks[0].begin(), Action{ActionKind::forward, 1, 0});
    refuses(s, "rank 0 (stages 0, 2) runs F0@1, an action of stage 1");
    // a stage's microbatch missing on a rank of several stages
    s = interleaved(2, 2, 2);
    for (auto it = s.ranks[1].begin(); it != s.ranks[1].end(); ++it)
        if (it->kind == ActionKind::backward && it->stage == 3 && it->microbatch == 1) {
            s.ranks[1].erase(it);
            break;
        }
    refuses(s, "rank 1 (stages 1, 3) never runs B1@3");
    // one rank of two stages: stage 1 takes stage 0's output, which must come first
    s = interleaved(1, 2, 2);
    std::swap(s.ranks[0][0], s.ranks[0][1]);  // F0@1 F0@0 B0@1 ...
    refuses(s, "runs F0@1 before F0@0, whose output it takes");
    // a placement that leaves a rank without a stage
    s = interleaved(2, 2, 2);
    s.stage_rank = {0, 0, 0, 0};
    refuses(s, "rank 1 holds no stage");
}

namespace {

using pipeline_test::Snapshot;

struct Run1 {
    std::string model;  // a path under the source tree
    int pp, v, microbatches, rounds;
    std::vector<std::string> splits;  // empty: the blocks evenly
    std::string optimizer;            // replaces the model's optimizer line ("" keeps it)
};

RunInputs inputs_of(const Run1& c) {
    RunInputs in;
    in.model_path = std::string(PTOOL_SOURCE_DIR) + "/" + c.model;
    std::string text = read_text(in.model_path);
    static const std::regex accumulation(R"(\ngradient_accumulation: *\d+)"),
        optimizer(R"(\noptimizer: [^\n]*)");
    text = std::regex_replace(text, accumulation, "");
    if (!c.optimizer.empty()) text = std::regex_replace(text, optimizer, "\n" + c.optimizer);
    in.model_text = text + "\ngradient_accumulation: " + std::to_string(c.rounds) + "\n";
    return in;
}

Plan plan_of(const Run1& c) {
    Plan p;
    p.path = p.name = "interleaved";
    p.dims = ParallelDims({{"pp", c.pp}}, {DimRole::pp});
    p.pipeline = PipelineSpec{};
    p.pipeline->split_points = c.splits;
    p.pipeline->schedule = ScheduleKind::interleaved_one_f_one_b;
    p.pipeline->virtual_stages = c.v;
    p.pipeline->microbatches = c.microbatches;
    return p;
}

// The pp dim's communicator with the first gradient rank 0 receives in step 0 scaled by 1 + 2^-10.
class PerturbedGradient final : public Communicator {
public:
    explicit PerturbedGradient(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {
        set_counter(inner_->counter(), "");
    }
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string backend() const override { return inner_->backend(); }
    void all_reduce(Tensor& t, ReduceOp op) override { inner_->all_reduce(t, op); }
    void all_gather(const Tensor& in, Tensor& out) override { inner_->all_gather(in, out); }
    void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
        inner_->reduce_scatter(in, out, op);
    }
    void broadcast(Tensor& t, int root) override { inner_->broadcast(t, root); }
    void all_to_all(const Tensor& in, Tensor& out) override { inner_->all_to_all(in, out); }
    void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                      const std::vector<int64_t>& recv_rows) override {
        inner_->all_to_all_v(in, send_rows, out, recv_rows);
    }
    void barrier() override { inner_->barrier(); }
    std::unique_ptr<Communicator> split(int color, int key) override { return inner_->split(color, key); }
    void batch_isend_irecv(const std::vector<P2POp>& ops) override {
        inner_->batch_isend_irecv(ops);
        for (const P2POp& op : ops)
            if (!done_ && rank() == 0 && op.kind == P2POp::Kind::recv && op.tag % 2 == 1) {  // a gradient
                backend_for(op.tensor->device()).scale(*op.tensor, 1.0 + 1.0 / 1024, *op.tensor);
                done_ = true;
            }
    }

private:
    std::unique_ptr<Communicator> inner_;
    bool done_ = false;
};

class PerturbLayer final : public RunLayer {
public:
    void wrap_mesh(DeviceMesh& mesh, const Plan& plan) override {
        mesh.wrap(plan.dims.index(DimRole::pp), [](std::unique_ptr<Communicator> c) {
            return std::make_unique<PerturbedGradient>(std::move(c));
        });
    }
};

// Steps `steps` steps of run: a snapshot and clip_grad_norm's total norm after each.
std::vector<Snapshot> steps_with_norms(Run& run, int steps, std::vector<double>& norms) {
    std::vector<Snapshot> out;
    for (int k = 0; k < steps; ++k) {
        const StepOutput s = run.step(k);
        out.push_back(pipeline_test::snapshot(run, s));
        norms.push_back(s.grad_norm);
    }
    return out;
}

// Every rank's differences from the one-stage run over two steps (empty: bitwise the same: its
// tensors and the gradient norm, which every rank computes), and whether each parameter is held by
// exactly one rank.
std::vector<std::string> compare_with_one_stage(const Run1& c, bool perturb) {
    const RunInputs in = inputs_of(c);
    const Plan plan = plan_of(c);
    std::vector<Snapshot> one;
    std::vector<double> one_norms;
    run_ranks(
        1, CommOptions{},
        [&](Communicator& w) {
            const Plan single = reference_plan(plan);
            Run run(in, single, w);
            one = steps_with_norms(run, 2, one_norms);
        },
        Device::cpu);
    std::vector<std::vector<Snapshot>> ranks(static_cast<size_t>(c.pp));
    std::vector<char> last(
        static_cast<size_t>(c.pp));  // not vector<bool>: ranks write their own element at once
    std::vector<std::vector<int>> held(static_cast<size_t>(c.pp));
    std::vector<std::vector<double>> norms(static_cast<size_t>(c.pp));
    run_ranks(
        c.pp, CommOptions{},
        [&](Communicator& w) {
            PerturbLayer layer;
            Run run(in, plan, w, perturb ? &layer : nullptr);
            held[w.rank()] = run.held_stages();
            last[w.rank()] = run.holds_last_stage();
            ranks[w.rank()] = steps_with_norms(run, 2, norms[w.rank()]);
        },
        Device::cpu);
    std::vector<std::string> out;
    std::map<std::string, int> holders;
    for (int r = 0; r < c.pp; ++r) {
        std::vector<int> want;
        for (int k = 0; k < c.v; ++k) want.push_back(r + k * c.pp);
        if (held[r] != want)
            out.push_back(fmt::format("rank {} holds stages {}", r, fmt::join(held[r], ", ")));
        if (last[r] != (r == c.pp - 1))
            out.push_back(fmt::format("rank {}: holds_last_stage {}", r, static_cast<bool>(last[r])));
        for (int k = 0; k < 2; ++k)
            for (const std::string& d : pipeline_test::differences(one[k], ranks[r][k], last[r], k))
                out.push_back(fmt::format("rank {}: {}", r, d));
        for (const auto& [name, v] : ranks[r][0].values) ++holders[name];
        if (norms[r] != one_norms)
            out.push_back(fmt::format("rank {}: gradient norms {} vs {}", r, fmt::join(norms[r], ", "),
                                      fmt::join(one_norms, ", ")));
    }
    for (const auto& [name, v] : one[0].values)
        if (holders[name] != 1) out.push_back(fmt::format("'{}' is held by {} ranks", name, holders[name]));
    return out;
}

}  // namespace

TEST_CASE("interleaved stages over rank threads give the one-stage run bitwise", "[cpu][schedule]") {
    const std::string mlp = "tests/data/models/mlp_stacked_8.yaml", llama = "models/llama_rope.yaml";
    const std::string adamw_clip =
        "optimizer: {type: adamw, lr: 0.01, weight_decay: 0.1}\nclip_grad_norm: 0.5";
    const std::vector<Run1> cases = {
        {mlp, 2, 2, 4, 1, {}, ""},          // 4 stages of two blocks, SGD
        {mlp, 2, 2, 2, 2, {}, ""},          // two rounds of gradient accumulation
        {mlp, 4, 2, 4, 1, {}, ""},          // 8 stages of one block
        {mlp, 4, 2, 8, 1, {}, ""},          // two groups of pp microbatches per stage
        {mlp, 1, 2, 2, 1, {}, ""},          // one rank: the stages hand over without p2p
        {mlp, 2, 2, 4, 1, {}, adamw_clip},  // AdamW, the norm over the stages in model order
        {mlp, 2, 4, 4, 1, {}, adamw_clip},  // 8 stages on 2 ranks
        {llama, 2, 2, 2, 2, {"layers.0", "layers.1", "norm"}, ""},  // rotary attention, AdamW, clipping
    };
    for (const Run1& c : cases) {
        INFO(c.model << " pp " << c.pp << " v " << c.v << ", " << c.microbatches << " microbatches x "
                     << c.rounds << " " << c.optimizer);
        for (const std::string& d : compare_with_one_stage(c, false)) FAIL_CHECK(d);
    }
}

TEST_CASE("a perturbed gradient received between interleaved stages fails the bitwise comparison",
          "[cpu][schedule]") {
    const Run1 c{"tests/data/models/mlp_stacked_8.yaml", 2, 2, 4, 1, {}, ""};
    const std::vector<std::string> d = compare_with_one_stage(c, true);
    CHECK(!d.empty());
    bool gradient = false;
    for (const std::string& s : d) gradient = gradient || s.find("rank 0: step 0: gradient of 'layers.") == 0;
    CHECK(gradient);  // rank 0's stages' gradients, from the first step
}

TEST_CASE("clip_grad_norm over interleaved stages sums the squares in the model's parameter order",
          "[cpu][schedule]") {
    // squares 1, 1 and 1e16 in model order sum to 1e16 + 2; rank 0 holding the first and the third
    // (its stages 0 and 2) and rank 1 the second, the gathered order 1, 1e16, 1 rounds to 1e16
    std::vector<double> ordered(2), gathered(2);
    run_ranks(
        2, CommOptions{},
        [&](Communicator& w) {
            auto param = [](double g) {
                auto p = std::make_shared<Parameter>();
                p->value = Tensor({1}, DType::float64), p->grad = Tensor({1}, DType::float64);
                p->grad.set(0, g);
                return p;
            };
            GradNormInputs in;
            std::map<const Parameter*, int64_t> order;
            const std::vector<std::pair<int64_t, double>> mine =
                w.rank() == 0 ? std::vector<std::pair<int64_t, double>>{{0, 1.0}, {2, 1e8}}
                              : std::vector<std::pair<int64_t, double>>{{1, 1.0}};
            for (const auto& [k, g] : mine) {
                in.params.push_back({fmt::format("p{}", k), param(g)});
                order[in.params.back().second.get()] = k;
            }
            in.placements = [](const Parameter*) { return Placements{}; };
            in.stages = &w;
            gathered[w.rank()] = clip_grad_norm(in, 1e30, backend_for(Device::cpu));
            in.order = [&](const Parameter* p) { return order.at(p); };
            ordered[w.rank()] = clip_grad_norm(in, 1e30, backend_for(Device::cpu));
        },
        Device::cpu);
    CHECK(ordered[0] == std::sqrt(1e16 + 2));
    CHECK(ordered[1] == ordered[0]);
    CHECK(gathered[0] == std::sqrt(1e16));  // the values tell the two orders apart
}

}  // namespace test_interleaved
