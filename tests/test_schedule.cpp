// Schedules (train/schedule.h): the lists each pipeline rank runs, check_schedule's refusals, and
// microbatch-keyed state: a run whose forwards all come before its backwards (GPipe's order on one
// stage) gives bitwise the gradients, parameters, outputs and losses of the one-stage loop.
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "comm/comm_choice.h"
#include "pipeline_cases.h"
#include "test_helpers.h"
#include "train/run.h"
#include "train/schedule.h"

using namespace ptool;

namespace test_schedule {

namespace {

std::string actions(const std::vector<Action>& list) {
    std::string s;
    for (const Action& a : list) s += (s.empty() ? "" : " ") + a.str();
    return s;
}

}  // namespace

TEST_CASE("schedules: the one-stage loop, GPipe and 1F1B as lists of actions", "[cpu]") {
    CHECK(actions(accumulation_schedule(2).ranks[0]) == "F0@0 B0@0 F1@0 B1@0 SYNC CLIP STEP");
    const Schedule g = pipeline_schedule(ScheduleKind::gpipe, 2, 2);
    CHECK(actions(g.ranks[0]) ==
          "F0@0 SEND_F0@0 F1@0 SEND_F1@0 RECV_B0@0 B0@0 RECV_B1@0 B1@0 SYNC CLIP STEP");
    CHECK(actions(g.ranks[1]) ==
          "RECV_F0@1 F0@1 RECV_F1@1 F1@1 B0@1 SEND_B0@1 B1@1 SEND_B1@1 SYNC CLIP STEP");
    const Schedule o = pipeline_schedule(ScheduleKind::one_f_one_b, 3, 4);
    // stage s warms up with 3 - s forwards; the last stage alternates from the start
    CHECK(actions(o.ranks[0]) ==
          "F0@0 SEND_F0@0 F1@0 SEND_F1@0 F2@0 SEND_F2@0 RECV_B0@0 B0@0 F3@0 SEND_F3@0 RECV_B1@0 B1@0 "
          "RECV_B2@0 B2@0 "
          "RECV_B3@0 B3@0 SYNC CLIP STEP");
    CHECK(actions(o.ranks[2]) ==
          "RECV_F0@2 F0@2 B0@2 SEND_B0@2 RECV_F1@2 F1@2 B1@2 SEND_B1@2 RECV_F2@2 F2@2 B2@2 SEND_B2@2 "
          "RECV_F3@2 F3@2 B3@2 "
          "SEND_B3@2 SYNC CLIP STEP");
    for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b})
        for (int stages : {1, 2, 3, 4, 8})
            for (int m : {1, 2, 3, 4, 8, 16}) {
                INFO(schedule_kind_name(k) << " " << stages << " stages, " << m << " microbatches");
                CHECK_NOTHROW(check_schedule(pipeline_schedule(k, stages, m)));
            }
    CHECK(p2p_tag({ActionKind::send_forward, 0, 3}) == p2p_tag({ActionKind::recv_forward, 1, 3}));
    CHECK(p2p_tag({ActionKind::send_backward, 1, 3}) != p2p_tag({ActionKind::send_forward, 1, 3}));
}

TEST_CASE("check_schedule refuses a list that breaks the schedule's definition, or cannot finish", "[cpu]") {
    auto refuses = [](Schedule s, const std::string& message) {
        INFO(message);
        CHECK_THROWS_WITH(check_schedule(s), Catch::Contains(message));
    };
    Schedule s = pipeline_schedule(ScheduleKind::gpipe, 2, 2);
    std::swap(s.ranks[1][1], s.ranks[1][4]);  // B0 before F0 on stage 1
    refuses(s, "rank 1 (stage 1) runs B0 before F0");
    s = pipeline_schedule(ScheduleKind::gpipe, 2, 2);
    s.ranks[1].erase(s.ranks[1].begin());  // stage 1 never receives microbatch 0
    refuses(s, "rank 1 (stage 1) never runs RECV_F0 (the stage's input)");
    s = pipeline_schedule(ScheduleKind::gpipe, 2, 2);
    s.ranks[0].erase(s.ranks[0].begin() + 5);  // stage 0 never runs B0
    refuses(s, "never runs B0");
    // criss-crossed: both stages send before they receive, outside one batch (pytorch#127332's hang)
    s = pipeline_schedule(ScheduleKind::gpipe, 2, 1);
    s.ranks[0] = {{ActionKind::forward, 0, 0},  {ActionKind::send_forward, 0, 0},
                  {ActionKind::backward, 0, 0}, {ActionKind::recv_backward, 0, 0},
                  {ActionKind::grad_sync},      {ActionKind::clip},
                  {ActionKind::optimizer_step}};
    refuses(s, "rank 0 (stage 0) runs RECV_B0 after B0");
    s.ranks[0] = {{ActionKind::forward, 0, 0},  {ActionKind::recv_backward, 0, 0},
                  {ActionKind::backward, 0, 0}, {ActionKind::send_forward, 0, 0},
                  {ActionKind::grad_sync},      {ActionKind::clip},
                  {ActionKind::optimizer_step}};
    refuses(s,
            "cannot finish: its sends and receives never meet: rank 0 waits in RECV_B0@0 (microbatch 0, tag "
            "1) for rank 1; "
            "rank 1 waits in RECV_F0@1 (microbatch 0, tag 0) for rank 0");
}

namespace {

// Every tensor a step leaves on each rank: outputs, the loss, gradients and parameters.
struct StepTensors {
    std::vector<std::vector<double>> values;
    double loss = 0;
};

std::string with_microbatches(std::string text, int n) {
    static const std::regex line(R"(\ngradient_accumulation: *\d+)");
    text = std::regex_replace(text, line, "");
    return text + "\ngradient_accumulation: " + std::to_string(n) + "\n";
}

std::vector<StepTensors> run_steps(const std::string& model, const std::string& plan_path, int microbatches,
                                   bool gpipe) {
    const std::string dir = PTOOL_SOURCE_DIR;
    RunInputs in;
    in.model_path = dir + "/models/" + model + ".yaml";
    in.model_text = with_microbatches(read_text(in.model_path), microbatches);
    const Plan plan = load_plan(dir + "/plans/" + plan_path + ".yaml");
    std::vector<StepTensors> out(plan.world_size() * 2);
    run_ranks(
        plan.world_size(), CommOptions{},
        [&](Communicator& w) {
            Run run(in, plan, w);
            if (gpipe) run.set_schedule(pipeline_schedule(ScheduleKind::gpipe, 1, microbatches));
            for (int k = 0; k < 2; ++k) {
                const StepOutput s = run.step(k);
                StepTensors& t = out[w.rank() * 2 + k];
                t.loss = s.loss;
                for (const Placed& o : s.outputs) t.values.push_back(o.t.to_doubles());
                for (const auto& [name, p] : run.model().named_parameters())
                    t.values.push_back(p->grad.to_doubles()), t.values.push_back(p->value.to_doubles());
            }
        },
        Device::cpu);
    return out;
}

}  // namespace

TEST_CASE("every forward before the backwards (GPipe's order) gives the one-stage loop's step bitwise",
          "[cpu]") {
    // checkpointed blocks under FSDP x TP with clipping; dropout, a tied head and sequence parallelism;
    // a shared module and SyncBatchNorm under DDP; checkpointing and dropout under DDP
    const std::vector<std::tuple<std::string, std::string, int>> cases = {
        {"llama_rope", "llama_rope_fsdp_tp_ac", 2},
        {"gpt2_tied", "gpt2_tied_tp_sp", 2},
        {"mpy_shared", "mpy_shared_sync_bn", 2},
        {"gpt2_tied", "gpt2_tied_ddp_ac", 2},
        {"mlp_stacked_adamw", "mlp_stacked_fsdp_tp", 4}};
    for (const auto& [model, plan, n] : cases) {
        INFO(model << " x " << plan << ", " << n << " microbatches");
        const auto loop = run_steps(model, plan, n, false), gpipe = run_steps(model, plan, n, true);
        REQUIRE(loop.size() == gpipe.size());
        for (size_t r = 0; r < loop.size(); ++r) {
            CHECK(loop[r].loss == gpipe[r].loss);
            REQUIRE(loop[r].values.size() == gpipe[r].values.size());
            for (size_t i = 0; i < loop[r].values.size(); ++i) CHECK(loop[r].values[i] == gpipe[r].values[i]);
        }
    }
}

TEST_CASE(
    "two pipeline stages, their activations and gradients sent between rank threads, give the one-stage run "
    "bitwise",
    "[cpu]") {
    using namespace pipeline_test;
    for (const Case& c : cases()) {
        INFO(c.model << " split at " << c.split << ", " << schedule_kind_name(c.schedule) << ", "
                     << c.microbatches << " microbatches");
        const RunInputs in = inputs(c);
        std::vector<Snapshot> one;
        run_ranks(
            1, CommOptions{},
            [&](Communicator& w) {
                const Plan single = one_device_plan(c);
                Run run(in, single, w);
                one = steps_of(run, 2);
            },
            Device::cpu);
        const Plan plan = pipeline_plan(c);
        std::vector<std::vector<Snapshot>> stages(2);
        std::vector<std::string> schedules(2);
        run_ranks(
            2, CommOptions{},
            [&](Communicator& w) {
                Run run(in, plan, w);
                for (const Action& a : run.schedule().ranks[run.stage()])
                    schedules[w.rank()] += a.str() + " ";
                stages[w.rank()] = steps_of(run, 2);
            },
            Device::cpu);
        CHECK(schedules[1].find("RECV_F0@1") == 0);  // stage 1 starts by receiving
        std::set<std::string> held;
        for (int s = 0; s < 2; ++s)
            for (int k = 0; k < 2; ++k) {
                for (const std::string& d : differences(one[k], stages[s][k], s == 1, k))
                    FAIL_CHECK("stage " << s << ": " << d);
                for (const auto& [name, v] : stages[s][k].values) held.insert(name);
            }
        CHECK(held.size() == one[0].values.size());  // every parameter on exactly one stage
        CHECK(stages[0][0].values.size() + stages[1][0].values.size() == one[0].values.size());
    }
}

TEST_CASE("a pipeline plan's split points make one stage per rank of its pp dim", "[cpu]") {
    pipeline_test::Case c{"llama_rope", "layers.1", ScheduleKind::gpipe, 2};
    const RunInputs in = pipeline_test::inputs(c);
    auto fails = [&](Plan plan, const std::string& message) {
        INFO(message);
        CHECK_THROWS_WITH(run_ranks(
                              plan.world_size(), CommOptions{},
                              [&](Communicator& w) { Run run(in, plan, w); }, Device::cpu),
                          Catch::Contains(message));
    };
    Plan p = pipeline_test::pipeline_plan(c);
    p.pipeline->split_points = {"layers.1.attn_block"};
    fails(p,
          "split point 'layers.1.attn_block' is not a module a stage can start at (the model's layers in "
          "forward order: "
          "tok_embeddings, layers.0, layers.1, norm, output)");
    Plan three = p;  // three stages, four microbatches of the batch's four rows
    three.dims = ParallelDims({{"pp", 3}}, {DimRole::pp});
    three.pipeline->microbatches = 4;
    three.pipeline->split_points = {"norm", "layers.1"};
    fails(three, "split point 'layers.1' leaves stage 1 empty");
    p.pipeline->split_points = {"layers.1", "norm"};
    fails(p, "2 split points make 3 stages, but the pipeline has 2 (2 pp ranks): give 1 split point");
}

}  // namespace test_schedule
