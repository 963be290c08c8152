// The style registry, the styles' static rules through the layout pass (shapes, placements and
// collectives without a tensor), and the lint's layout conflicts.
#include <catch2/catch.hpp>

#include "verify/verify.h"
#include "test_helpers.h"

using namespace ptool;

namespace {

Model model(const std::string& name) {
    return load_model_text(read_text(PTOOL_SOURCE_DIR "/models/" + name + ".yaml"), name + ".yaml", "", false);
}

Plan plan_text(const std::string& text) { return load_plan_text(text, "plan.yaml"); }

const CallLayout& call(const LayoutReport& r, const std::string& fqn) {
    for (const CallLayout& c : r.calls)
        if (c.fqn == fqn) return c;
    FAIL("no call of '" << fqn << "'");
    return r.calls.front();
}

std::map<std::string, std::pair<int, int64_t>> totals(const std::vector<CommCost>& costs) {
    std::map<std::string, std::pair<int, int64_t>> t;
    for (const CommCost& c : costs) t[c.op].first += 1, t[c.op].second += c.bytes;
    return t;
}

}  // namespace

TEST_CASE("the registry holds every style by name, once", "[cpu]") {
    const std::vector<std::string> names = style_names();
    for (const char* name : {"colwise", "rowwise", "sequence_parallel", "prepare_input", "prepare_output", "prepare_input_output"}) {
        INFO(name);
        REQUIRE(find_style(name));
        CHECK(find_style(name)->name() == name);
        CHECK(std::count(names.begin(), names.end(), name) == 1);
    }
    CHECK(find_style("colwize") == nullptr);
}

TEST_CASE("the layout pass follows a Megatron block's placements and costs its collectives", "[cpu]") {
    const Model m = model("gpt_block");
    const Plan p = load_plan(PTOOL_SOURCE_DIR "/plans/gpt_block_tp.yaml");
    const Resolution res = resolve_plan(m, p);
    const LayoutReport& r = res.layouts;
    // q/k/v colwise: Replicate in, heads sharded out; o_proj rowwise gathers nothing and reduces once
    CHECK(call(r, "attn_block.attn.q_proj").in.p.is_replicate());
    CHECK(call(r, "attn_block.attn.q_proj").out.p.same_as(Placement::shard(-1), 3));
    CHECK(call(r, "attn_block.attn.q_proj").out.global == Shape{4, 16, 32});
    CHECK(call(r, "attn_block.attn.o_proj").in.p.same_as(Placement::shard(2), 3));
    CHECK(call(r, "attn_block.attn.o_proj").out.p.is_replicate());
    CHECK(r.output.global == Shape{4, 16, 64});
    // forward: o_proj's and c_proj's all_reduce of [4, 16, 32] fp32; backward: the three
    // projections' and c_fc's input gradients, Partial -> all_reduce
    const auto fwd = totals(r.forward), bwd = totals(r.backward);
    CHECK(fwd.at("all_reduce") == std::pair<int, int64_t>{2, 2 * 4 * 16 * 32 * 4});
    CHECK(bwd.at("all_reduce") == std::pair<int, int64_t>{4, 4 * 4 * 16 * 32 * 4});
    CHECK(fwd.size() == 1);
    CHECK(bwd.size() == 1);
}

TEST_CASE("sequence parallel: norms on sequence shards, gathered into the MLP and scattered out", "[cpu]") {
    const Model m = model("seq_mlp");
    const Resolution res = resolve_plan(m, load_plan(PTOOL_SOURCE_DIR "/plans/seq_mlp_sp.yaml"));
    const LayoutReport& r = res.layouts;
    CHECK(r.input.p.same_as(Placement::shard(1), 3));
    CHECK(call(r, "norm1").out.p.same_as(Placement::shard(1), 3));
    CHECK(call(r, "net1").out.p.same_as(Placement::shard(-1), 3));
    CHECK(call(r, "net2").out.p.same_as(Placement::shard(1), 3));
    CHECK(r.output.p.same_as(Placement::shard(1), 3));
    const auto fwd = totals(r.forward), bwd = totals(r.backward);
    CHECK(fwd.at("all_gather").first == 2);      // net1's input, and the output for the loss
    CHECK(fwd.at("reduce_scatter").first == 1);  // net2's output
    CHECK(bwd.at("all_reduce").first == 4);  // the norms' 3 parameter gradients, net2's bias over its rows
    CHECK(bwd.at("reduce_scatter").first == 1);  // net1's input gradient back to sequence shards
}

TEST_CASE("layout conflicts are exit-2 errors at the plan entry, with the fix", "[cpu]") {
    const Model m = model("seq_mlp");
    // torchtitan's slip: a sequence-parallel norm feeding a colwise linear that declares Replicate
    require_input_error([&] { resolve_plan(m, plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                                        "    norm1: sequence_parallel\n    net1: colwise\n    net2: rowwise\n")); },
                        {"plan.yaml:6:5:", "'net1' (colwise) takes its input as Replicate() but 'norm1' outputs Shard(1)",
                         "add prepare_input shard(1) -> replicate on 'net1'", "input_layouts: shard(1) on 'net1'"});
    // a colwise output fed to a plain norm
    require_input_error([&] { resolve_plan(m, plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                                        "    net2: colwise\n")); },
                        {"plan.yaml:5:5:", "'net2' outputs Shard(-1) but 'norm2' (rms_norm) needs whole rows", "seq_mlp.yaml:"});
    // a sequence-sharded activation into attention
    const Model llama = model("llama_block");
    require_input_error([&] { resolve_plan(llama, plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                                            "    attn_block.input_layernorm: sequence_parallel\n"
                                                            "    'attn_block.self_attn.[qkv]_proj': {style: colwise, input_layouts: shard(1), output_layouts: shard(1)}\n")); },
                        {"attention 'attn_block.self_attn' needs the whole sequence"});
}

TEST_CASE("a plan's lint leaves a correct plan alone and the runtime reads the same rule", "[cpu]") {
    for (const char* name : {"gpt_block_tp", "llama_block_tp", "seq_mlp_sp", "mlp_stacked_fsdp_tp", "embedding_rowwise"}) {
        INFO(name);
        const Plan p = load_plan(std::string(PTOOL_SOURCE_DIR "/plans/") + name + ".yaml");
        const std::string model_path = [&] {  // "model: models/x.yaml" or "(model: models/x.yaml)" in the header
            const size_t at = p.yaml_text.find("models/");
            return p.yaml_text.substr(at, p.yaml_text.find(".yaml", at) + 5 - at);
        }();
        const Model m = load_model_text(read_text(std::string(PTOOL_SOURCE_DIR "/") + model_path), model_path, "", false);
        const Resolution res = resolve_plan(m, p);
        CHECK(res.layouts.calls.size() >= 3);
        for (const ResolvedStyle& rs : res.styles) {
            const StyleRule rule = rs.entry->style.style->rule(*rs.module, rs.entry->style);
            if (rule.pre) CHECK(call(res.layouts, rs.fqn).in.p.same_as(rule.pre->from, static_cast<int64_t>(call(res.layouts, rs.fqn).in.global.size())));
            if (rule.post) CHECK(call(res.layouts, rs.fqn).out.p.same_as(rule.post->to, static_cast<int64_t>(call(res.layouts, rs.fqn).out.global.size())));
        }
    }
}

namespace {

// verify of a shipped model under a plan given as text, in this process.
VerifyReport verify_text(const std::string& model_name, const std::string& plan) {
    VerifyJob job;
    job.inputs.model_path = PTOOL_SOURCE_DIR "/models/" + model_name + ".yaml";
    job.inputs.model_text = read_text(job.inputs.model_path);
    job.plans = {plan_text(plan)};
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    return verify(job, *launch);
}

}  // namespace

TEST_CASE("replicate: a module run whole on every rank, its input checked to be whole", "[cpu]") {
    // the example of docs/adding_a_style.md: gpt_block's final norm and its MLP norm declared replicated
    const std::string plan = "mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  src_data_rank: 0\n  plan:\n"
                             "    'attn_block.attn.[qkv]_proj': colwise\n    attn_block.attn.o_proj: rowwise\n"
                             "    mlp_block.ln_2: replicate\n    ln_f: replicate\n";
    const Resolution res = resolve_plan(model("gpt_block"), plan_text(plan));
    CHECK(call(res.layouts, "ln_f").in.p.is_replicate());
    const VerifyReport r = verify_text("gpt_block", plan);
    REQUIRE(r.plans.size() == 1);
    CHECK(r.pass);
    CHECK(r.plans[0].failed == 0);
    CHECK(r.plans[0].run.init_counts.by_op().at("broadcast").calls >= 2);  // its parameters come from src_data_rank
    // where the input is not whole, the claim is an error
    require_input_error([&] { resolve_plan(model("mlp"), plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                                                      "    net1: colwise\n    relu: replicate\n")); },
                        {"'relu' (replicate) takes its input as Replicate() but 'net1' outputs Shard(-1)"});
}
