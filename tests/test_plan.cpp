// Planning units: rank classes over uneven shards, and the plan search being the same on any
// number of threads (it simulates candidates in parallel; TSan runs this file).
#include <tuple>

#include "parallel/parallelize.h"
#include "plan/search.h"
#include "plan/shrink.h"
#include "plan/time_model.h"
#include "test_helpers.h"
#include "train/simulate.h"

using namespace ptool;

namespace test_plan {

// The blocks of a Llama-shaped model's `layers` repeat (one attention_norm each).
int64_t blocks(const Model& m) {
    int64_t n = 0;
    for (const auto& [name, p] : m.state_dict())
        if (name.rfind("layers.", 0) == 0 && name.find(".attention_norm.weight") != std::string::npos) ++n;
    return n;
}

TEST_CASE("rank classes follow torch.chunk's piece sizes", "[cpu]") {
    const std::string text =
        "batch: {input: [5, 8]}\nmodules:\n  - {name: fc, type: linear, in: 8, out: 8}\nloss: mean\n";
    MetaAllocation meta;
    const Model m = load_model_text(text, "m.yaml", "", false);
    const Plan plan =
        load_plan_text("mesh: {dp: 4}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n", "p.yaml");
    const std::vector<RankClass> classes = rank_classes(m, plan);
    REQUIRE(classes.size() == 3);  // rows 2, 2, 1, 0
    CHECK(classes[0].ranks == std::vector<int>{0, 1});
    CHECK(classes[1].ranks == std::vector<int>{2});
    CHECK(classes[2].ranks == std::vector<int>{3});
    const Plan even = load_plan_text(
        "mesh: {dp: 4, tp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n"
        "tensor_parallel: {mesh_dim: tp, plan: {fc: colwise}}\n",
        "p.yaml");
    const Model m8 = load_model_text(
        "batch: {input: [8, 8]}\nmodules:\n  - {name: fc, type: linear, in: 8, out: 8}\nloss: mean\n",
        "m.yaml", "", false);
    CHECK(rank_classes(m8, even).size() == 1);  // every piece the same size: one rank stands for 8
}

TEST_CASE("the plan search gives the same plans on one thread and on several", "[cpu]") {
    const std::string path = std::string(PTOOL_SOURCE_DIR) + "/models/scale/llama3_8b.yaml";
    const std::string text = read_text(path);
    const Cluster c = load_cluster(std::string(PTOOL_SOURCE_DIR) + "/clusters/h100_8x8.yaml");
    SearchOptions o;
    o.world_size = 8;
    o.threads = 1;
    const SearchResult one = search_plans(text, path, c, o);
    o.threads = 3;
    const SearchResult three = search_plans(text, path, c, o);
    REQUIRE(one.fitting.size() >= 3);
    REQUIRE(one.fitting.size() == three.fitting.size());
    REQUIRE(one.rejected.size() == three.rejected.size());
    for (size_t i = 0; i < one.rejected.size(); ++i)
        CHECK(one.rejected[i].reason == three.rejected[i].reason);
    for (size_t i = 0; i < one.fitting.size(); ++i) {
        INFO("candidate " << i);
        CHECK(one.fitting[i].plan_text == three.fitting[i].plan_text);
        CHECK(one.fitting[i].microbatches == three.fitting[i].microbatches);
        CHECK(one.fitting[i].peak == three.fitting[i].peak);
        CHECK(one.fitting[i].time.step == three.fitting[i].time.step);
    }
    for (size_t i = 1; i < one.fitting.size(); ++i)
        CHECK(one.fitting[i - 1].time.step <= one.fitting[i].time.step);
}

TEST_CASE("a model's variants set in its one document build what a fresh document of each builds", "[cpu]") {
    const std::string path = std::string(PTOOL_SOURCE_DIR) + "/models/scale/llama3_8b.yaml";
    const std::string text = read_text(path);
    MetaAllocation meta;
    const Model file = load_model_text(text, path, "", false);
    // what a model holds: its parameters' names and shapes, its batch and its microbatches
    auto summary = [](const Model& m) {
        std::vector<std::string> out;
        for (const auto& [name, p] : m.state_dict()) out.push_back(name + shape_str(p->value.shape()));
        out.push_back("input" + shape_str(m.input.shape));
        out.push_back("target" + (m.target ? shape_str(m.target->shape) : std::string("-")));
        out.push_back("microbatches " + std::to_string(m.gradient_accumulation));
        return out;
    };
    const int64_t rows = file.input.shape[0];
    ModelVariants reused(text, path);
    // (blocks, microbatches, rows): 0 blocks or rows keep the file's, after variants that changed them
    for (const auto& [count, microbatches, batch] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {5, 2, 2 * rows}, {0, 1, 0}, {4, 4, rows / 2}, {3, 1, 0}, {0, 2, 0}, {6, 1, rows}}) {
        INFO("blocks " << count << ", microbatches " << microbatches << ", rows " << batch);
        const Model a = load_model_document(reused.at(count, microbatches, batch), path, "", false);
        ModelVariants fresh(text, path);
        const Model b = load_model_document(fresh.at(count, microbatches, batch), path, "", false);
        CHECK(summary(a) == summary(b));
        CHECK(blocks(a) == (count > 0 ? count : blocks(file)));
        CHECK(a.gradient_accumulation == microbatches);
        CHECK(a.input.shape[0] == (batch > 0 ? batch : rows));
        CHECK(a.target->shape[0] == a.input.shape[0]);
    }
    CHECK(blocks(file) == 32);  // the file's, which the variants above left as it was
}

TEST_CASE("a model's variants keep the file's own text where they set nothing (012 is twelve)", "[cpu]") {
    // a repeat's count and the batch's rows written with leading zeros, which the loader reads as
    // decimal (yaml-cpp's own conversion would read 012 as octal and refuse 08)
    std::string text = read_text(std::string(PTOOL_SOURCE_DIR) + "/models/llama_rope.yaml");
    auto edit = [&](const std::string& from, const std::string& to) {
        const size_t at = text.find(from);
        REQUIRE(at != std::string::npos);
        text.replace(at, from.size(), to);
    };
    edit("count: 2", "count: 08");
    edit("tokens: [4, 8]", "tokens: [08, 8]");
    MetaAllocation meta;
    const Model file = load_model_text(text, "lead.yaml", "", false);
    REQUIRE(file.input.shape[0] == 8);
    REQUIRE(blocks(file) == 8);
    ModelVariants v(text, "lead.yaml");
    for (const auto& [count, rows, want_blocks, want_rows] :
         std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {0, 0, 8, 8}, {5, 16, 5, 16}, {0, 0, 8, 8}, {6, 0, 6, 8}, {0, 4, 8, 4}}) {
        INFO("count " << count << ", rows " << rows);
        const Model m = load_model_document(v.at(count, 2, rows), "lead.yaml", "", false);
        CHECK(blocks(m) == want_blocks);
        CHECK(m.input.shape[0] == want_rows);
        CHECK(m.gradient_accumulation == 2);
    }
}

TEST_CASE("a 1-D mesh needs no mesh_dim, a 2-D mesh names it", "[cpu]") {
    const Plan tp = load_plan_text("mesh: {tp: 2}\ntensor_parallel:\n  plan: {net1: colwise}\n", "p.yaml");
    CHECK(tp.dims.name(DimRole::tp) == "tp");
    const Plan dp = load_plan_text("mesh: {dp: 4}\ndata_parallel: {mode: replicate}\n", "p.yaml");
    REQUIRE(dp.data_parallel);
    CHECK(dp.data_parallel->mesh_dims == std::vector<std::string>{"dp"});
    CHECK(dp.dims.name(DimRole::dp_replicate) == "dp");
    CHECK_THROWS_WITH(
        load_plan_text("mesh: {dp: 2, tp: 2}\ndata_parallel: {mode: replicate}\n", "p.yaml"),
        Catch::Contains("p.yaml:2:16: 'data_parallel' needs 'mesh_dim': the mesh has 2 dims (dp, tp)"));
    CHECK_THROWS_WITH(
        load_plan_text(
            "mesh: {dp: 2}\ndata_parallel: {mode: replicate}\ntensor_parallel: {plan: {a: colwise}}\n",
            "p.yaml"),
        Catch::Contains("both use mesh dim 'dp'"));
}

TEST_CASE("the plan's sections give its mesh dims their roles, checked in one place", "[cpu]") {
    // HSDP x TP: fully_shard over [rep, shard], tensor parallel over tp
    const Plan p = load_plan_text(
        "mesh: {rep: 2, shard: 3, tp: 2}\ntensor_parallel: {mesh_dim: tp, plan: {fc: colwise}}\n"
        "data_parallel: {mesh_dim: [rep, shard], mode: fully_shard}\n",
        "p.yaml");
    const ParallelDims& d = p.dims;
    CHECK(d.index(DimRole::dp_replicate) == 0);
    CHECK(d.index(DimRole::dp_shard) == 1);
    CHECK(d.index(DimRole::tp) == 2);
    CHECK_FALSE(d.has(DimRole::pp));
    CHECK(d.size(DimRole::pp) == 1);
    CHECK(d.data_dims() == std::vector<int>{0, 1});
    CHECK(d.data_size() == 6);
    CHECK(d.param_nesting() == std::vector<int>{2, 0, 1});  // tp cuts first, fully_shard the tp piece's rows
    CHECK(d.group(GroupName::batch).label == "rep+shard");
    CHECK(d.counted_dims("rep+shard") == std::vector<int>{0, 1});
    CHECK(d.counted_dims("tp") == std::vector<int>{2});
    CHECK(d.counted_dims("world") == std::vector<int>{0, 1, 2});
    CHECK(d.counted_dims("nope").empty());
    CHECK(p.data_parallel->hybrid());
    CHECK(p.data_parallel->mesh_dim_names() == "rep x shard");
    // one dim per mode: replicate is dp_replicate, fully_shard dp_shard; a dim no section names has no role
    const Plan fs = load_plan_text(
        "mesh: {dp: 4, spare: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard}\n", "p.yaml");
    CHECK(fs.dims.index(DimRole::dp_shard) == 0);
    CHECK_FALSE(fs.dims.has(DimRole::dp_replicate));
    CHECK_FALSE(fs.dims.role(1).has_value());
    // --mesh keeps the roles
    Plan resized = p;
    resized.resize_mesh("shard", 4, "--mesh shard=4");
    CHECK(resized.dims.data_size() == 8);
    CHECK(resized.dims.index(DimRole::dp_shard) == 1);

    auto fails = [](const std::string& text, const std::string& message) {
        CHECK_THROWS_WITH(load_plan_text(text, "p.yaml"), Catch::Contains(message));
    };
    fails("mesh: {a: 2, b: 2}\ndata_parallel: {mesh_dim: [a, b]}\n",
          "p.yaml:2:27: two mesh dims ([replicate, shard]) are HSDP");
    fails("mesh: {a: 2, b: 2}\ndata_parallel: {mesh_dim: [a, b], mode: replicate}\n",
          "mode replicate takes one mesh dim");
    fails("mesh: {a: 2, b: 2}\ndata_parallel: {mesh_dim: [a, a], mode: fully_shard}\n",
          "p.yaml:2:31: mesh dim 'a' is named twice");
    fails("mesh: {a: 2, b: 2, c: 2}\ndata_parallel: {mesh_dim: [a, b, c], mode: fully_shard}\n",
          "'mesh_dim' lists 3 dims");
    fails("mesh: {a: 2, b: 2}\ndata_parallel: {mesh_dim: [a, d], mode: fully_shard}\n",
          "p.yaml:2:31: mesh_dim 'd' is not a dim of the mesh");
    fails(
        "mesh: {a: 2, tp: 2}\ntensor_parallel: {mesh_dim: tp, plan: {}}\ndata_parallel: {mesh_dim: [a, tp], "
        "mode: fully_shard}\n",
        "p.yaml:3:31: data_parallel and tensor_parallel both use mesh dim 'tp'");
}

TEST_CASE("a plan's gradient_accumulation overrides the model's, for the reference too", "[cpu]") {
    // 8 rows; the model says 2 microbatches
    const std::string model_text =
        "batch: {input: [8, 4]}\nmodules:\n  - {name: fc, type: linear, in: 4, out: 4}\nloss: mean\n"
        "gradient_accumulation: 2\n";
    MetaAllocation meta;
    const Model m = load_model_text(model_text, "m.yaml", "", false);
    const std::string dp2 = "mesh: {dp: 2}\ndata_parallel: {mode: replicate}\n";
    const Plan plain = load_plan_text(dp2, "p.yaml");
    const Plan four = load_plan_text(dp2 + "gradient_accumulation: 4\n", "p.yaml");
    CHECK(plain.gradient_accumulation == 0);
    CHECK(plain.accumulation_rounds(m) == 2);  // the model's
    CHECK(four.accumulation_rounds(m) == 4);   // the plan's
    CHECK(four.gradient_accumulation_where.str() == "p.yaml:3:24");
    // the single-device reference runs the plan's microbatches, and so does a run's schedule
    CHECK(reference_plan(four).accumulation_rounds(m) == 4);
    CHECK(reference_plan(plain).accumulation_rounds(m) == 2);
    // the layout pass walks one microbatch of one dp rank's rows: 8 / (2 x 4)
    CHECK(resolve_plan(m, four).layouts.calls.front().in.global == Shape{1, 4});
    CHECK(resolve_plan(m, plain).layouts.calls.front().in.global == Shape{2, 4});
    // a pipeline's rounds: the step runs rounds x its microbatches
    const Plan pp = load_plan_text(
        "mesh: {pp: 1}\npipeline_parallel: {microbatches: 2}\ngradient_accumulation: 4\n", "p.yaml");
    CHECK(pp.accumulation_rounds(m) * pp.microbatches_per_round() == 8);
    CHECK(reference_plan(pp).accumulation_rounds(m) * reference_plan(pp).microbatches_per_round() == 8);

    auto refused = [&](const std::string& plan, const std::string& message) {
        INFO(plan);
        CHECK_THROWS_WITH(resolve_plan(m, load_plan_text(plan, "p.yaml")), Catch::Contains(message));
    };
    refused(
        dp2 + "gradient_accumulation: 3\n",
        "p.yaml:3:24: gradient_accumulation 3 does not divide the batch's 8 rows into equal microbatches");
    refused(
        dp2 + "gradient_accumulation: 8\n",
        "p.yaml:3:24: each of the 8 microbatches of 1 row (the plan's gradient_accumulation) does not split "
        "evenly over the 2 data ranks");
    refused("mesh: {pp: 1}\npipeline_parallel: {microbatches: 2}\ngradient_accumulation: 8\n",
            "p.yaml:3:24: the batch's 8 rows do not cut into 16 microbatches (8 rounds of "
            "gradient_accumulation x 2)");
    refused(dp2 + "gradient_accumulation: 0\n",
            "p.yaml:3:24: 'gradient_accumulation' must be positive, got 0");
    refused(dp2 + "gradient_accumulation: 65537\n",
            "p.yaml:3:24: gradient_accumulation 65537 is over the limit");
    refused("mesh: {pp: 1}\npipeline_parallel: {microbatches: 2, gradient_accumulation: 2}\n",
            "p.yaml:2:61: gradient_accumulation is a top-level key of the plan");
}

TEST_CASE("a collective across nodes runs at one NIC per rank of its group in a node", "[cpu]") {
    const Cluster cl = load_cluster_text(
        "nodes: 8\ngpus_per_node: 8\nmemory_gib: 80\ntflops: {bfloat16: 989}\nmemory_bandwidth_gb_s: 3350\n"
        "intra_node: {bandwidth_gb_s: 300, latency_us: 3}\ninter_node: {bandwidth_gb_s: 25, latency_us: 8}\n",
        "c.yaml");
    const std::string tp = "tensor_parallel: {mesh_dim: tp, plan: {net1: colwise}}\n";
    auto link = [&](const std::string& plan, const std::string& dim) {
        return collective_link(load_plan_text(plan, "p.yaml"), dim, cl);
    };
    // fully_shard over all 64: 8 ranks of each group in a node, 8 NICs: 200 GB/s
    CHECK(link("mesh: {dp: 64}\ndata_parallel: {mode: fully_shard}\n", "dp").bandwidth == 200e9);
    CHECK(link("mesh: {dp: 64}\ndata_parallel: {mode: fully_shard}\n", "dp").latency == 8e-6);
    // dp 32 x tp 2: 4 dp ranks a node; dp 8 x tp 8: one, a NIC's 25 GB/s; tp 8 inside a node: NVLink
    const std::string dp_tp = "data_parallel: {mesh_dim: dp, mode: fully_shard}\n" + tp;
    CHECK(link("mesh: {dp: 32, tp: 2}\n" + dp_tp, "dp").bandwidth == 100e9);
    CHECK(link("mesh: {dp: 8, tp: 8}\n" + dp_tp, "dp").bandwidth == 25e9);
    CHECK(link("mesh: {dp: 8, tp: 8}\n" + dp_tp, "tp").bandwidth == 300e9);
    // never above NVLink's: 16 NICs' worth is capped at the node's 300 GB/s
    const Cluster wide = load_cluster_text(
        "nodes: 4\ngpus_per_node: 16\nmemory_gib: 80\ntflops: {bfloat16: 989}\nmemory_bandwidth_gb_s: 3350\n"
        "intra_node: {bandwidth_gb_s: 300, latency_us: 3}\ninter_node: {bandwidth_gb_s: 25, latency_us: 8}\n",
        "w.yaml");
    CHECK(collective_link(load_plan_text("mesh: {dp: 64}\ndata_parallel: {mode: fully_shard}\n", "p.yaml"),
                          "dp", wide)
              .bandwidth == 300e9);
}

TEST_CASE("the lint's findings carry a kind the planner reads, not their words", "[cpu]") {
    const Model model = load_model_text(
        "batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: linear, in: 8, out: 6}\n"
        "  - {name: b, type: linear, in: 6, out: 8}\nloss: mean\n",
        "m.yaml", "", false);
    const Plan plan = load_plan_text(
        "mesh: {tp: 4}\ntensor_parallel:\n  plan: {a: colwise, b: rowwise, nothing_here: colwise}\n",
        "p.yaml");
    const Resolution res = resolve_plan(model, plan);
    std::map<DiagnosticKind, int> kinds;
    for (const Diagnostic& w : res.warnings) ++kinds[w.kind];
    CHECK(kinds[DiagnosticKind::uneven_shard] >= 1);  // 6 features over 4 ranks
    CHECK(kinds[DiagnosticKind::unmatched_pattern] == 1);
    CHECK(kinds[DiagnosticKind::other] == 0);
}

TEST_CASE("a plan the planner wrote reads back the same without the hostile-file checks", "[cpu]") {
    const std::string path = std::string(PTOOL_SOURCE_DIR) + "/models/scale/llama3_8b.yaml";
    MetaAllocation meta;
    const Model model = load_model_text(read_text(path), path, "", false);
    const PlanTemplate tpl = plan_template(model);
    std::vector<PlanChoice> choices(5);
    choices[0].dp = 8, choices[0].tp = 2, choices[0].checkpoint = true, choices[0].selective = true;
    choices[1].dp = 16, choices[1].dp_shard = 8;  // HSDP
    choices[2].dp = 4, choices[2].dp_mode = DataParallelMode::replicate, choices[2].zero_stage = 2;
    choices[3].pp = 4, choices[3].dp = 2, choices[3].tp = 2,
    choices[3].schedule = ScheduleKind::interleaved_one_f_one_b, choices[3].virtual_stages = 2,
    choices[3].pp_microbatches = 8, choices[3].repeat = "layers",
    choices[3].stage_blocks = {3, 5, 4, 4, 4, 4, 4, 4}, choices[3].gradient_accumulation = 2;
    choices[4].dp = 8, choices[4].cp = 2, choices[4].float8 = Float8Scaling::tensorwise;
    for (const PlanChoice& c : choices) {
        const std::string text = write_plan(tpl, c);
        INFO(text);
        const Plan a = load_plan_text(text, "generated.yaml"), b = load_emitted_plan(text, "generated.yaml");
        CHECK(b.yaml_text == a.yaml_text);
        CHECK(b.name == a.name);
        REQUIRE(b.mesh().size() == a.mesh().size());
        for (size_t d = 0; d < a.mesh().size(); ++d) {
            CHECK(b.mesh()[d].name == a.mesh()[d].name);
            CHECK(b.mesh()[d].size == a.mesh()[d].size);
        }
        for (DimRole role : {DimRole::dp_replicate, DimRole::dp_shard, DimRole::tp, DimRole::cp, DimRole::pp})
            CHECK(b.dims.index(role) == a.dims.index(role));
        REQUIRE(b.tp_plan.size() == a.tp_plan.size());
        for (size_t i = 0; i < a.tp_plan.size(); ++i) CHECK(b.tp_plan[i].pattern == a.tp_plan[i].pattern);
        CHECK(b.loss_parallel == a.loss_parallel);
        REQUIRE(b.data_parallel.has_value() == a.data_parallel.has_value());
        if (a.data_parallel) {
            CHECK(b.data_parallel->mode == a.data_parallel->mode);
            CHECK(b.data_parallel->mesh_dims == a.data_parallel->mesh_dims);
            CHECK(b.data_parallel->fully_shard == a.data_parallel->fully_shard);
            CHECK(b.data_parallel->zero_stage == a.data_parallel->zero_stage);
        }
        REQUIRE(b.pipeline.has_value() == a.pipeline.has_value());
        if (a.pipeline) {
            CHECK(b.pipeline_stages() == a.pipeline_stages());
            CHECK(b.microbatches_per_round() == a.microbatches_per_round());
            CHECK(b.pipeline->schedule == a.pipeline->schedule);
            CHECK(b.pipeline->split_points == a.pipeline->split_points);
        }
        CHECK(b.context_parallel.has_value() == a.context_parallel.has_value());
        CHECK(b.float8.has_value() == a.float8.has_value());
        CHECK(b.compile == a.compile);
        CHECK(b.gradient_accumulation == a.gradient_accumulation);
        CHECK(b.activation_checkpointing.modules == a.activation_checkpointing.modules);
        CHECK(b.activation_checkpointing.mode == a.activation_checkpointing.mode);
    }
    // the size limit still holds (a plan written for a model of many long names can outgrow a plan
    // file's: it would not load back from the file `ptool plan` writes)
    CHECK_THROWS_WITH(load_emitted_plan("mesh: {dp: 2}\n" + std::string(5 << 20, '#'), "generated.yaml"),
                      Catch::Contains("over the limit"));
    // the plan's own rules still hold (only the file's checks are skipped): an unknown key is refused
    // where it stands
    CHECK_THROWS_WITH(load_emitted_plan("mesh: {dp: 2}\nmesh_dims: 1\n", "generated.yaml"),
                      Catch::Contains("generated.yaml:2:1") && Catch::Contains("unknown key 'mesh_dims'"));
}

}  // namespace test_plan
