// One resolved job: a verify resolves each plan once (the lint's resolution is every rank's,
// rebound to its own model; the reference's is its memory check's and its run's), and a rebound
// resolution is the one the other model would have resolved to (Resolution::rebound).
#include <catch2/catch.hpp>

#include "pipeline_cases.h"
#include "same_runs.h"
#include "test_helpers.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_resolve_once {

namespace {

Model model(const std::string& name, const std::string& dtype = "") {
    return load_model_text(read_text(PTOOL_SOURCE_DIR "/models/" + name + ".yaml"), name + ".yaml", dtype,
                           false);
}

Plan shipped_plan(const std::string& name) {
    return load_plan(PTOOL_SOURCE_DIR "/plans/" + name + ".yaml");
}

// resolve_plan's runs during one verify of `job` on rank threads
int64_t resolutions_of(const VerifyJob& job, bool beside) {
    VerifyJob j = job;
    j.options.reference_beside = beside;
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    const int64_t before = resolve_plan_count();
    const VerifyReport report = verify(j, *launch);
    CHECK(report.pass);
    CHECK(report.plans.size() == j.plans.size());
    return resolve_plan_count() - before;
}

std::vector<std::string> strings(const std::set<const Module*>& modules) {
    std::vector<std::string> out;
    for (const Module* m : modules) out.push_back(m->fqn());
    std::sort(out.begin(), out.end());
    return out;
}

// Everything a Run reads of a resolution, `got` against `want` (both of one model): the same
// modules, styles, layouts, collectives and data and expert parallel resolutions.
void check_same_resolution(const Resolution& got, const Resolution& want) {
    REQUIRE(got.styles.size() == want.styles.size());
    for (size_t i = 0; i < got.styles.size(); ++i) {
        CHECK(got.styles[i].fqn == want.styles[i].fqn);
        CHECK(got.styles[i].module == want.styles[i].module);
        CHECK(got.styles[i].entry == want.styles[i].entry);
    }
    REQUIRE(got.layouts.calls.size() == want.layouts.calls.size());
    for (size_t i = 0; i < got.layouts.calls.size(); ++i) {
        const CallLayout &g = got.layouts.calls[i], &w = want.layouts.calls[i];
        INFO(w.fqn);
        CHECK(g.module == w.module);
        CHECK(g.fqn == w.fqn);
        CHECK(g.depth == w.depth);
        CHECK(g.in.str() == w.in.str());
        CHECK(g.out.str() == w.out.str());
        REQUIRE((g.style == nullptr) == (w.style == nullptr));
        if (g.style)
            CHECK(g.style - got.styles.data() == w.style - want.styles.data());  // into its own styles
    }
    CHECK(got.layouts.input.str() == want.layouts.input.str());
    CHECK(got.layouts.output.str() == want.layouts.output.str());
    auto costs = [](const std::vector<CommCost>& cs) {
        std::vector<std::string> out;
        for (const CommCost& c : cs)
            out.push_back(fmt::format("{} {} {} {}", collective_name(c.op), c.bytes, c.module, int(c.phase)));
        return out;
    };
    CHECK(costs(got.layouts.forward) == costs(want.layouts.forward));
    CHECK(costs(got.layouts.backward) == costs(want.layouts.backward));
    CHECK(got.checkpointing.checkpointed == want.checkpointing.checkpointed);
    CHECK(got.checkpointing.selective == want.checkpointing.selective);
    CHECK(got.checkpointing.recompute_core == want.checkpointing.recompute_core);
    CHECK(got.input_placement.str() == want.input_placement.str());
    CHECK(got.tp == want.tp);
    CHECK(diagnostic_strings(got.warnings) == diagnostic_strings(want.warnings));
    CHECK(diagnostic_strings(got.causes) == diagnostic_strings(want.causes));
    CHECK(got.dp.active == want.dp.active);
    CHECK(got.dp.size == want.dp.size);
    REQUIRE(got.dp.units.size() == want.dp.units.size());
    for (size_t i = 0; i < got.dp.units.size(); ++i) CHECK(got.dp.units[i].params == want.dp.units[i].params);
    CHECK(got.dp.ignored_params == want.dp.ignored_params);
    CHECK(got.ep.owner == want.ep.owner);
}

}  // namespace

TEST_CASE("a verify resolves each plan once: the lint's resolution is every rank's", "[cpu]") {
    // DDP x TP on 4 rank threads: before, the lint, the reference's memory check, the reference and
    // every rank each resolved (7); now the plan once and its reference once
    const VerifyJob ddp_tp = shipped_job({"mlp_stacked_adamw", "mlp_stacked_dp2_tp2", 1, nullptr});
    CHECK(resolutions_of(ddp_tp, true) == 2);
    CHECK(resolutions_of(ddp_tp, false) == 2);
    // two plans computing alike share one reference: three plans resolved
    VerifyJob two = ddp_tp;
    two.plans.push_back(shipped_plan("mlp_stacked_fsdp_tp"));
    CHECK(resolutions_of(two, true) == 3);
    // a pipeline (each rank keeps its own stage of the rebound resolution) and attention
    for (const pipeline_test::Case& c : pipeline_test::cases()) {
        INFO(c.model);
        VerifyJob pp;
        pp.inputs = pipeline_test::inputs(c);
        pp.plans = {pipeline_test::pipeline_plan(c)};
        pp.options.steps = 1;
        CHECK(resolutions_of(pp, true) == 2);
    }
}

TEST_CASE("a resolution rebound to another model of the same text is that model's own resolution", "[cpu]") {
    for (const auto& [m, p] :
         std::vector<std::pair<std::string, std::string>>{{"gpt_block", "gpt_block_tp"},
                                                          {"llama_block", "llama_block_tp"},
                                                          {"mlp_stacked_adamw", "mlp_stacked_fsdp_tp"},
                                                          {"mlp_stacked_adamw", "mlp_stacked_hsdp_tp"},
                                                          {"seq_mlp", "seq_mlp_sp"},
                                                          {"gpt2_tied", "gpt2_tied_ddp_ac"},
                                                          {"gpt2_tied", "gpt2_tied_tp_sp"},
                                                          {"hf_tiny_llama31", "hf_tiny_llama31_fsdp_tp_sac"},
                                                          {"llama_rope", "llama_rope_tp_sp_ac_every2"},
                                                          {"moe_mixtral", "moe_mixtral_ep_tp"}}) {
        INFO(m << " x " << p);
        const Plan plan = shipped_plan(p);
        const Model a = model(m), b = model(m);
        const Resolution ra = resolve_plan(a, plan);
        const Resolution fresh = resolve_plan(b, plan);
        check_same_resolution(ra.rebound(a, b), fresh);
        check_same_resolution(fresh.rebound(b, b), fresh);  // a copy whose calls point into its own styles
        CHECK(strings(ra.rebound(a, b).checkpointing.checkpointed) == strings(ra.checkpointing.checkpointed));
    }
}

TEST_CASE("a resolution is not rebound to a model of another text", "[cpu]") {
    const Plan plan = shipped_plan("mlp_root_module");
    const Model mlp = model("mlp");
    const Resolution res = resolve_plan(mlp, plan);
    // other modules; the same modules in another dtype
    CHECK_THROWS_AS(res.rebound(mlp, model("mlp_stacked_adamw")), std::logic_error);
    CHECK_THROWS_WITH(res.rebound(mlp, model("mlp", "float64")), Catch::Contains("rebinding a resolution"));
}

}  // namespace test_resolve_once
