// zero_bubble (torch's ScheduleInterleavedZeroBubble) run on rank threads: each microbatch's backward
// split into I (input gradients, sent upstream) and W (parameter gradients, later), the first stage's
// I empty and its W the whole backward, as torch's stage does. Every rank's parameters, losses and
// gradient norms after two steps are bit for bit those of the same pipeline under 1F1B (one stage per
// rank) or interleaved 1F1B (two): the Ws come in microbatch order on every stage. verify passes it
// against the one-device reference, and the plans it cannot run yet are exit 2 at their keys.
#include <map>

#include "comm/comm_threads.h"
#include "test_helpers.h"
#include "train/run.h"
#include "verify/compare.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_zero_bubble_run {

namespace {

struct RankState {
    std::vector<Tensor> params;
    std::vector<double> losses, norms;
};

RunInputs inputs(const std::string& model) {
    RunInputs in;
    in.model_path = PTOOL_SOURCE_DIR "/" + model;
    in.model_text = read_text(in.model_path);
    return in;
}

std::vector<RankState> run_two_steps(const std::string& model, const std::string& plan_text) {
    const RunInputs in = inputs(model);
    const Plan plan = load_plan_text(plan_text, "plan.yaml");
    std::vector<RankState> out(static_cast<size_t>(plan.world_size()));
    run_rank_threads(plan.world_size(), CommOptions{}, [&](Communicator& w) {
        RankState& r = out[static_cast<size_t>(w.rank())];
        Run run(in, plan, w);
        for (int64_t k = 0; k < 2; ++k) {
            const StepOutput s = run.step(k);
            r.losses.push_back(s.loss), r.norms.push_back(s.grad_norm);
        }
        for_each_param(*run.model().root,
                       [&](const std::string&, const ParamPtr& p) { r.params.push_back(p->value.clone()); });
    });
    return out;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
}

const char* const kLlamaTpSp = "tests/data/pipeline/llama_rope_pp2_tp2_sp.yaml";

}  // namespace

TEST_CASE("zero_bubble gives 1F1B's and interleaved 1F1B's steps bit for bit", "[cpu][schedule]") {
    const std::string llama_tp = read_text(PTOOL_SOURCE_DIR "/" + std::string(kLlamaTpSp));
    const struct {
        const char* what;
        std::string model, plan, reference;
    } cases[] = {
        {"an MLP in 2 stages, 4 microbatches", "models/mlp_stacked_mse.yaml",
         "mesh: {pp: 2}\npipeline_parallel: {split_points: [layers.1], schedule: zero_bubble, microbatches: "
         "4}\n",
         "mesh: {pp: 2}\npipeline_parallel: {split_points: [layers.1], schedule: 1f1b, microbatches: 4}\n"},
        {"an MLP of 8 blocks in 4 stages on 2 ranks (v 2), 4 microbatches",
         "tests/data/models/mlp_stacked_8.yaml",
         "mesh: {pp: 2}\npipeline_parallel: {schedule: zero_bubble, virtual_stages: 2, microbatches: 4}\n",
         "mesh: {pp: 2}\npipeline_parallel: {schedule: interleaved_1f1b, virtual_stages: 2, microbatches: "
         "4}\n"},
        {"Llama with tp 2, sequence parallel and loss_parallel, AdamW and clipping", "models/llama_rope.yaml",
         replaced(replaced(llama_tp, "schedule: 1f1b, microbatches: 2}",
                           "schedule: zero_bubble, microbatches: 4}"),
                  "mesh: {pp: 2, tp: 2}", "mesh: {pp: 2, tp: 2}\ngradient_accumulation: 1"),
         replaced(replaced(llama_tp, "microbatches: 2}", "microbatches: 4}"), "mesh: {pp: 2, tp: 2}",
                  "mesh: {pp: 2, tp: 2}\ngradient_accumulation: 1")},
        {"Llama under tp 2 in the model's 2 rounds of gradient accumulation (the order run once a round)",
         "models/llama_rope.yaml", replaced(llama_tp, "schedule: 1f1b", "schedule: zero_bubble"), llama_tp},
        {"Llama SFT over 2 DDP ranks", "models/llama_sft.yaml",
         "mesh: {pp: 2, dp: 2}\ngradient_accumulation: 1\npipeline_parallel: {mesh_dim: pp, split_points: "
         "[layers.1], schedule: zero_bubble, microbatches: 2}\ndata_parallel: {mesh_dim: dp, mode: "
         "replicate}\n",
         "mesh: {pp: 2, dp: 2}\ngradient_accumulation: 1\npipeline_parallel: {mesh_dim: pp, split_points: "
         "[layers.1], schedule: 1f1b, microbatches: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n"},
    };
    for (const auto& c : cases) {
        INFO(c.what);
        const std::vector<RankState> zb = run_two_steps(c.model, c.plan),
                                     ref = run_two_steps(c.model, c.reference);
        REQUIRE(zb.size() == ref.size());
        for (size_t r = 0; r < zb.size(); ++r) {
            INFO("rank " << r);
            CHECK(zb[r].losses == ref[r].losses);
            CHECK(zb[r].norms == ref[r].norms);
            REQUIRE(zb[r].params.size() == ref[r].params.size());
            for (size_t i = 0; i < zb[r].params.size(); ++i)
                CHECK(same_bits(zb[r].params[i], ref[r].params[i]));
        }
    }
}

namespace {

// Every parameter of the run by name after two steps (the pp ranks hold different stages), the
// step losses summed over the ranks (the last stage's rank has them), the gradient norms of rank 0.
struct ByName {
    std::map<std::string, Tensor> params;
    std::vector<double> losses, norms;
};

ByName run_by_name(const std::string& model, const std::string& plan_text) {
    const RunInputs in = inputs(model);
    const Plan plan = load_plan_text(plan_text, "plan.yaml");
    const int world = plan.world_size();
    std::vector<std::map<std::string, Tensor>> params(static_cast<size_t>(world));
    std::vector<std::vector<double>> losses(static_cast<size_t>(world)), norms(losses);
    run_rank_threads(world, CommOptions{}, [&](Communicator& w) {
        const size_t r = static_cast<size_t>(w.rank());
        Run run(in, plan, w);
        for (int64_t k = 0; k < 2; ++k) {
            const StepOutput s = run.step(k);
            losses[r].push_back(s.loss), norms[r].push_back(s.grad_norm);
        }
        for (const auto& [name, p] : run.model().named_parameters()) params[r][name] = p->value.clone();
    });
    ByName out;
    out.norms = norms[0];
    out.losses.assign(2, 0.0);
    for (size_t r = 0; r < params.size(); ++r) {
        out.params.insert(params[r].begin(), params[r].end());
        for (size_t k = 0; k < 2; ++k) out.losses[k] += losses[r][k];
    }
    return out;
}

}  // namespace

TEST_CASE("zbv and dualpipev: the V placement gives interleaved 1F1B's parameters bit for bit",
          "[cpu][schedule]") {
    // 4 stages on 2 ranks: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (the V); interleaved
    // 1F1B holds 0 and 2, 1 and 3 (the loop). The same stages, each its Ws in microbatch order.
    const std::string mlp = "tests/data/models/mlp_stacked_8.yaml", llama = "models/llama_rope.yaml";
    const std::string llama_split = "split_points: [layers.0, layers.1, norm], ";
    const struct {
        std::string model, split, schedule;
        int microbatches;
    } cases[] = {
        {mlp, "", "zbv", 2},
        {mlp, "", "zbv", 4},
        {mlp, "", "dualpipev", 4},
        {mlp, "", "dualpipev", 8},
        {llama, llama_split, "zbv", 4},
        {llama, llama_split, "dualpipev", 4},
    };
    for (const auto& c : cases) {
        INFO(c.model << " " << c.schedule << " " << c.microbatches << " microbatches");
        const std::string head = "mesh: {pp: 2}\ngradient_accumulation: 1\npipeline_parallel: {" + c.split;
        const std::string tail = ", microbatches: " + std::to_string(c.microbatches) + "}\n";
        const ByName v = run_by_name(c.model, head + "schedule: " + c.schedule + tail);
        const ByName loop =
            run_by_name(c.model, head + "schedule: interleaved_1f1b, virtual_stages: 2" + tail);
        CHECK(v.losses == loop.losses);
        CHECK(v.norms == loop.norms);
        REQUIRE(v.params.size() == loop.params.size());
        for (const auto& [name, t] : loop.params) {
            INFO(name);
            REQUIRE(v.params.count(name));
            CHECK(same_bits(v.params.at(name), t));
        }
    }
}

TEST_CASE("zero_bubble: verify holds it to the one-device reference", "[cpu][schedule]") {
    VerifyJob job;
    job.inputs = inputs("models/llama_rope.yaml");
    job.plans = {load_plan_text(
        replaced(replaced(read_text(PTOOL_SOURCE_DIR "/" + std::string(kLlamaTpSp)),
                          "schedule: 1f1b, microbatches: 2}", "schedule: zero_bubble, microbatches: 4}"),
                 "mesh: {pp: 2, tp: 2}", "mesh: {pp: 2, tp: 2}\ngradient_accumulation: 1"),
        "plan.yaml")};
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    const VerifyReport v = verify(job, *launch);
    REQUIRE(v.plans.size() == 1);
    CHECK(v.pass);
}

TEST_CASE("zero_bubble under fully_shard x tp: one reduce_scatter per unit a step, 1F1B's numbers",
          "[cpu][schedule]") {
    // torch.distributed.pipelining's FSDP2 under a split backward: each unit's backwards accumulate
    // into one unsharded gradient, reduce_scattered once at the gradient sync (1F1B: once per
    // microbatch), so a W that follows the next microbatch's forward or I finds the step's gradient
    const std::string shipped = "tests/data/pipeline/llama_rope_pp2_dp2_tp2_fsdp_zb.yaml";
    const std::string zb = read_text(PTOOL_SOURCE_DIR "/" + shipped);
    REQUIRE(zb.find("mode: fully_shard") != std::string::npos);
    const std::string one_f_one_b = replaced(zb, "schedule: zero_bubble", "schedule: 1f1b");
    const ByName split = run_by_name("models/llama_rope.yaml", zb),
                 whole = run_by_name("models/llama_rope.yaml", one_f_one_b);
    REQUIRE(split.params.size() == whole.params.size());
    for (const auto& [name, t] : whole.params) {  // the sums' order differs: to rounding
        INFO(name);
        const TensorDiff d = compare_tensors(split.params.at(name), t, Tolerance{});
        CHECK(d.max_abs <= 1e-6);
    }
    for (size_t k = 0; k < 2; ++k) CHECK(std::abs(split.losses[k] - whole.losses[k]) <= 1e-6);

    auto reduce_scatters = [](const VerifyReport& v) {  // over dp (tp's sequence parallel has its own)
        REQUIRE(v.plans.size() == 1);
        int64_t calls = 0;
        for (const auto& [key, totals] : v.plans[0].run.step_counts.entries())
            if (std::get<0>(key) == Collective::reduce_scatter && std::get<1>(key) == "dp")
                calls += totals.calls;
        return calls;
    };
    auto verified = [&](const std::string& text) {
        VerifyJob job;
        job.inputs = inputs("models/llama_rope.yaml");
        job.plans = {load_plan_text(text, "plan.yaml")};
        const auto launch = in_process_launch(Device::cpu, CommOptions{});
        return verify(job, *launch);
    };
    const VerifyReport v = verified(zb), w = verified(one_f_one_b);
    CHECK(v.pass);
    CHECK(w.pass);
    // FSDP2's mixed precision: bf16 gradients summed into a float32 one after each W (the root's
    // unit among them, whose hooks wrap the stage: its post_backward at the W, not the I)
    CHECK(verified(replaced(zb, "fully_shard: [\"layers.*\"]}",
                            "fully_shard: [\"layers.*\"], mixed_precision: {param_dtype: bfloat16, "
                            "reduce_dtype: float32}}"))
              .pass);
    // rank 0 (stage 0: the root and layers.0; 2 microbatches, 2 steps): 2 units x 2 steps against
    // 2 units x 2 microbatches x 2 steps
    CHECK(reduce_scatters(v) == 4);
    CHECK(reduce_scatters(w) == 8);
}

TEST_CASE("a W before its I: verify fails the plan before any step, naming the stage's W and I",
          "[cpu][schedule]") {
    // the runtime's lists are checked again where a layer changed them: the violation is the
    // plan's verdict (exit 1), not the job's failure, and nothing is compared
    VerifyJob job;
    job.inputs = inputs("models/gpt2_tied.yaml");
    job.plans = {load_plan_text(read_text(PTOOL_SOURCE_DIR "/tests/data/pipeline/gpt2_tied_pp2_zbv.yaml"),
                                "plan.yaml")};
    job.options.fault = parse_fault("pp_weight_before_input:2");
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    const VerifyReport v = verify(job, *launch);
    REQUIRE(v.plans.size() == 1);
    CHECK_FALSE(v.pass);
    CHECK(v.plans[0].tensors.empty());
    CHECK(v.plans[0].localisation.find("rank 1 (stages 1, 2) runs W0@2 before I0@2") != std::string::npos);
    // without the fault the same job passes
    job.options.fault = Fault{};
    CHECK(verify(job, *launch).pass);
}

TEST_CASE("a W that computes wrong: verify names its stage and microbatch by rerunning it whole",
          "[cpu][schedule]") {
    // DualPipeV runs each stage's first microbatches as whole backwards: the stage's first W is of a
    // later microbatch, which the probes (verify/weight_probe.h) must find, not microbatch 0
    const std::string plan_text =
        read_text(PTOOL_SOURCE_DIR "/tests/data/pipeline/mlp8_pp2_dualpipev_ddp.yaml");
    const Plan plan = load_plan_text(plan_text, "plan.yaml");
    const Schedule sch = checked_pipeline_schedule(plan.pipeline->schedule, plan.pipeline_stages(),
                                                   static_cast<int>(plan.microbatches_per_round()), 1,
                                                   plan.pipeline->virtual_stages);
    const int stage = 2;
    int first = -1;
    for (const Action& a : sch.ranks[static_cast<size_t>(sch.rank_of(stage))])
        if (a.kind == ActionKind::backward_weight && a.stage == stage && first < 0) first = a.microbatch;
    REQUIRE(first > 0);
    VerifyJob job;
    job.inputs = inputs("tests/data/models/mlp_stacked_8.yaml");
    job.plans = {plan};
    job.options.fault = parse_fault("pp_weight_doubled:2");
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    const VerifyReport v = verify(job, *launch);
    REQUIRE(v.plans.size() == 1);
    CHECK_FALSE(v.pass);
    CHECK(v.plans[0].localisation.find(fmt::format(
              "the split backward's W{}@2 (stage 2, microbatch {}, on pp rank 1)", first, first)) !=
          std::string::npos);
    // a fault that is not the W's: the probes find no W to blame
    job.options.fault = parse_fault("pp_grad_scaled_twice:2");
    const VerifyReport w = verify(job, *launch);
    CHECK_FALSE(w.pass);
    CHECK(w.plans[0].localisation.find("the split backward's") == std::string::npos);
}

TEST_CASE("zero_bubble: what it does not run yet is exit 2 at the key", "[cpu]") {
    auto load = [](const std::string& text) { return load_plan_text(text, "plan.yaml"); };
    require_input_error(
        [&] {
            load("mesh: {pp: 2}\npipeline_parallel: {schedule: zbv, virtual_stages: 3, microbatches: 4}\n");
        },
        {"plan.yaml:2:", "virtual_stages 3: zbv holds exactly 2 stages per rank"});
    require_input_error(
        [&] { load("mesh: {pp: 2}\npipeline_parallel: {schedule: DualPipeV, microbatches: 3}\n"); },
        {"plan.yaml:2:", "dualpipev needs at least as many microbatches as stages: 3"});
    CHECK(load("mesh: {pp: 2}\npipeline_parallel: {schedule: ZBVZeroBubble, microbatches: 2}\n")
              .pipeline->schedule == ScheduleKind::zbv);
    // torch's rule: microbatches a multiple of max(1, microbatches / pp)
    require_input_error(
        [&] { load("mesh: {pp: 2}\npipeline_parallel: {schedule: zero_bubble, microbatches: 5}\n"); },
        {"plan.yaml:2:", "zero_bubble: 5 microbatches must be a multiple of its rounds"});
    CHECK(load("mesh: {pp: 2}\npipeline_parallel: {schedule: InterleavedZeroBubble, microbatches: 4}\n")
              .pipeline->schedule == ScheduleKind::zero_bubble);
}

}  // namespace test_zero_bubble_run
