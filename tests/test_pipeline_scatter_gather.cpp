// Megatron's scatter_gather_tensors_in_pipeline (pipeline_parallel: {scatter_gather: true},
// train/run_stage.cpp): an activation or gradient whole on every tp rank goes between stages as
// each tp rank's 1/tp of its elements and is all_gathered over tp after the receive. The run gives
// the plain pipeline's numbers bit for bit with half the p2p bytes at tp 2 and one all_gather per
// receive, verify passes it, and a boundary whose elements do not split is exit 2 at the key.
#include "comm/comm_threads.h"
#include "test_helpers.h"
#include "train/run.h"
#include "train/simulate.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_pipeline_scatter_gather {

namespace {

const char* const kPlan = PTOOL_SOURCE_DIR "/tests/data/pipeline/mlp_pp2_dp2_tp2_fsdp.yaml";

RunInputs mlp_inputs() {
    RunInputs in;
    in.model_path = PTOOL_SOURCE_DIR "/models/mlp_stacked_mse.yaml";
    in.model_text = read_text(in.model_path);
    return in;
}

// The shipped pp2 x dp2 x tp2 plan with scatter_gather set (or not).
Plan plan_with(bool scatter_gather) {
    std::string text = read_text(kPlan);
    const std::string key = "microbatches: 2}";
    REQUIRE(text.find(key) != std::string::npos);
    if (scatter_gather) text.replace(text.find(key), key.size(), "microbatches: 2, scatter_gather: true}");
    return load_plan_text(text, "plan.yaml");
}

struct Seen {
    std::vector<Tensor> params;
    int64_t p2p_bytes = 0, all_gathers = 0;
};

std::vector<Seen> run_two_steps(const Plan& plan) {
    const RunInputs in = mlp_inputs();
    std::vector<Seen> seen(static_cast<size_t>(plan.world_size()));
    run_rank_threads(plan.world_size(), CommOptions{}, [&](Communicator& w) {
        Seen& s = seen[static_cast<size_t>(w.rank())];
        Run run(in, plan, w);
        run.step(0);
        run.counter().reset();
        run.step(1);
        for_each_param(*run.model().root,
                       [&](const std::string&, const ParamPtr& p) { s.params.push_back(p->value.clone()); });
        auto ops = run.counter().by_op();
        s.p2p_bytes = ops[Collective::send].bytes + ops[Collective::recv].bytes;
        s.all_gathers = ops[Collective::all_gather].calls;
    });
    return seen;
}

}  // namespace

TEST_CASE("scatter_gather sends 1/tp of a whole boundary and all_gathers it, with the same numbers",
          "[cpu][schedule]") {
    const std::vector<Seen> plain = run_two_steps(plan_with(false)), sg = run_two_steps(plan_with(true));
    REQUIRE(plain.size() == 8);
    for (size_t r = 0; r < plain.size(); ++r) {
        INFO("rank " << r);
        REQUIRE(sg[r].params.size() == plain[r].params.size());
        for (size_t i = 0; i < plain[r].params.size(); ++i)
            CHECK(same_bits(sg[r].params[i], plain[r].params[i]));
        // each stage receives 2 microbatches a step (activations on stage 1, gradients on stage 0)
        // of 4 rows x 10 features in float32, sent whole or as one of 2 pieces
        CHECK(plain[r].p2p_bytes == 2 * 2 * 4 * 10 * 4);
        CHECK(sg[r].p2p_bytes == plain[r].p2p_bytes / 2);
        CHECK(sg[r].all_gathers == plain[r].all_gathers + 2);
    }
    // and verify holds the pipeline to the single-device reference
    VerifyJob job;
    job.inputs = mlp_inputs();
    job.plans = {plan_with(true)};
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    const VerifyReport v = verify(job, *launch);
    REQUIRE(v.plans.size() == 1);
    CHECK(v.pass);
}

TEST_CASE("scatter_gather: a boundary whose elements do not split over tp is exit 2 at the key", "[cpu]") {
    RunInputs in;
    in.model_path = "odd.yaml";
    in.model_text =
        "name: odd\nseed: 1\nbatch: {input: [6, 5], target: [6, 5]}\nmodules:\n"
        "  - {name: layers, type: repeat, count: 2, modules: [{name: net1, type: linear, in: 5, out: 8},\n"
        "     {name: net2, type: linear, in: 8, out: 5}]}\nloss: mse\noptimizer: {type: sgd, lr: 0.1}\n";
    const std::string plan =
        "mesh: {pp: 2, tp: 2}\n"
        "pipeline_parallel: {mesh_dim: pp, split_points: [layers.1], microbatches: 2, scatter_gather: true}\n"
        "tensor_parallel: {mesh_dim: tp, plan: {\"layers.*.net1\": colwise, \"layers.*.net2\": rowwise}}\n";
    // 3 rows x 5 features a microbatch: 15 elements
    require_input_error(
        [&] { simulate_rank(in, load_plan_text(plan, "plan.yaml"), 0, 1); },
        {"plan.yaml:2:", "scatter_gather: stage 0's output [3, 5] has 15 elements", "2 equal pieces"});
    // without it the same pipeline runs
    std::string plain = plan;
    plain.replace(plain.find(", scatter_gather: true"), 22, "");
    CHECK_NOTHROW(simulate_rank(in, load_plan_text(plain, "plan.yaml"), 0, 1));
    // a value that is no boolean
    std::string bad = plan;
    bad.replace(bad.find("scatter_gather: true"), 20, "scatter_gather: maybe");
    require_input_error([&] { load_plan_text(bad, "plan.yaml"); }, {"plan.yaml:2:", "scatter_gather"});
}

}  // namespace test_pipeline_scatter_gather
