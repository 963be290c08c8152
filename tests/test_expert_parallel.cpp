// Expert parallelism's units (parallel/expert_parallel.h): the section borrows a data dim and its
// refusals, which rank owns which expert, what a rank holds of the experts (the simulated memory),
// and a run whose every expert tensor is compared with the reference, gathered from its owner.
#include <regex>

#include "parallel/expert_parallel.h"
#include "plan/explain.h"
#include "plan/search.h"
#include "same_runs.h"
#include "test_helpers.h"
#include "train/simulate.h"

using namespace ptool;

namespace test_expert_parallel {

TEST_CASE("expert_parallel borrows a data dim: ep names it, its role stays the data one", "[cpu]") {
    const Plan p = load_plan_text(
        "mesh: {rep: 2, shard: 2, tp: 2}\ntensor_parallel: {mesh_dim: tp, plan: {}}\n"
        "data_parallel: {mesh_dim: [rep, shard], mode: fully_shard}\nexpert_parallel: {mesh_dim: shard}\n",
        "p.yaml");
    CHECK(p.dims.index(DimRole::ep) == 1);
    CHECK(p.dims.size(DimRole::ep) == 2);
    CHECK(p.dims.role(1) == DimRole::dp_shard);
    CHECK(p.dims.data_dims() == std::vector<int>{0, 1});  // the batch still splits over it
    CHECK(p.expert_parallel->where.str() == "p.yaml:4:18");
    // one data dim: mesh_dim may go
    const Plan one =
        load_plan_text("mesh: {dp: 4}\ndata_parallel: {mode: replicate}\nexpert_parallel: {}\n", "p.yaml");
    CHECK(one.dims.index(DimRole::ep) == 0);
    Plan resized = one;
    resized.resize_mesh("dp", 8, "--mesh dp=8");
    CHECK(resized.dims.size(DimRole::ep) == 8);

    CHECK_THAT(plan_error("mesh: {dp: 2}\nexpert_parallel: {mesh_dim: dp}\n"),
               Catch::Contains("p.yaml:2:18: expert_parallel borrows a data-parallel dim"));
    CHECK_THAT(
        plan_error("mesh: {dp: 2, tp: 2}\ndata_parallel: {mesh_dim: dp}\nexpert_parallel: {mesh_dim: tp}\n"),
        Catch::Contains("p.yaml:3:29: expert_parallel's mesh_dim 'tp' is not a data-parallel dim"));
    CHECK_THAT(plan_error("mesh: {a: 2, b: 2}\ndata_parallel: {mesh_dim: [a, b], mode: fully_shard}\n"
                          "expert_parallel: {}\n"),
               Catch::Contains("'expert_parallel' needs 'mesh_dim': one of data_parallel's dims (a, b)"));
    CHECK_THAT(
        plan_error("mesh: {dp: 2}\ndata_parallel: {mode: replicate, zero_stage: 1}\nexpert_parallel: {}\n"),
        Catch::Contains("zero_stage with expert_parallel"));
    CHECK_THAT(
        plan_error("mesh: {dp: 2}\ndata_parallel: {mode: replicate}\nexpert_parallel: {mesh_dims: dp}\n"),
        Catch::Contains("mesh_dims"));
}

TEST_CASE("each ep rank owns a contiguous block of every layer's experts, what does not divide is refused",
          "[cpu]") {
    CHECK(expert_owner(0, 8, 4) == 0);
    CHECK(expert_owner(1, 8, 4) == 0);
    CHECK(expert_owner(2, 8, 4) == 1);
    CHECK(expert_owner(7, 8, 4) == 3);
    MetaAllocation meta;
    // 6 experts per layer, 2 layers; 24 rows (2 microbatches of 12), which split over 3 and 4 dp ranks
    const std::string path = PTOOL_SOURCE_DIR "/models/moe_qwen2.yaml";
    std::string text = read_text(path);
    const std::string rows = "tokens: [8, 8]";
    REQUIRE(text.find(rows) != std::string::npos);
    text.replace(text.find(rows), rows.size(), "tokens: [24, 8]");
    const Model m = load_model_text(text, path, "", false);
    const std::string ep = "data_parallel: {mode: replicate}\nexpert_parallel: {}\n";
    const Resolution r = resolve_plan(m, load_plan_text("mesh: {dp: 3}\n" + ep, "p.yaml"));
    REQUIRE(r.ep.active);
    CHECK(r.ep.size == 3);
    CHECK(r.ep.layers == std::vector<std::string>{"layers.0.mlp_block.mlp", "layers.1.mlp_block.mlp"});
    CHECK(r.ep.owner.size() == 2 * 6 * 3);  // gate_proj, up_proj, down_proj of 6 experts in 2 layers
    CHECK(r.ep.owner.at("layers.1.mlp_block.mlp.experts.3.up_proj.weight") == 1);
    CHECK(r.ep.owner.at("layers.0.mlp_block.mlp.experts.5.down_proj.weight") == 2);
    CHECK_FALSE(r.ep.owner.count("layers.0.mlp_block.mlp.shared_expert.up_proj.weight"));  // data parallel's
    // data parallel leaves the experts out of its buckets
    for (const auto& replica : r.dp.replicas)
        for (const BucketSpec& b : replica.buckets)
            for (const std::string& name : b.params) CHECK_FALSE(r.ep.owner.count(name));
    CHECK(r.dp.expert_params.size() == r.ep.owner.size());
    require_input_error(
        [&] { resolve_plan(m, load_plan_text("mesh: {dp: 4}\n" + ep, "p.yaml")); },
        {"p.yaml:3:18", "moe 'layers.0.mlp_block.mlp' has 6 experts, which do not divide over"});
    const std::string dense = PTOOL_SOURCE_DIR "/models/llama_rope.yaml";
    const Model d = load_model_text(read_text(dense), dense, "", false);
    require_input_error([&] { resolve_plan(d, load_plan_text("mesh: {dp: 2}\n" + ep, "p.yaml")); },
                        {"expert_parallel: the model has no moe layer"});
}

TEST_CASE("an ep rank holds its own experts only: the others' parameters take no memory", "[cpu]") {
    RunInputs in;
    in.model_path = PTOOL_SOURCE_DIR "/models/moe_mixtral.yaml";
    in.model_text = read_text(in.model_path);
    const auto params = [&](const char* plan) {
        const Plan p = load_plan(PTOOL_SOURCE_DIR "/plans/" + std::string(plan) + ".yaml");
        return simulate_rank(in, p, 0, 1).memory.at_peak[static_cast<size_t>(MemoryUse::parameters)];
    };
    // moe_mixtral: 2 layers x 4 experts x 3 x 32 x 48 float32 = 147456 B of experts; ep 2 holds half of them
    CHECK(params("moe_mixtral_ddp") - params("moe_mixtral_ep") == 147456 / 2);
}

// Verifies a shipped expert-parallel case for one step: PASS, and every expert tensor (each layer's
// experts' parameters and gradients) compared, of its shape, agreeing, its replicas in `replicas`;
// returns how many there are.
static int verified_experts(const ShippedCase& c, ReplicaState replicas) {
    const VerifyReport rep = verify(shipped_job(c), *in_process_launch(Device::cpu, CommOptions{}));
    REQUIRE(rep.plans.size() == 1);
    CHECK(rep.pass);
    int experts = 0;
    const StepRecord& step = rep.plans[0].run.steps.at(0);
    for (const auto& [name, d] : step.vs_reference)
        if (name.find(".experts.") != std::string::npos) {
            INFO(name);
            CHECK(d.pass);
            CHECK(d.shape_ok);
            CHECK(step.replicas.at(name) == replicas);
            ++experts;
        }
    return experts;
}

TEST_CASE("under expert parallelism every expert tensor is compared, gathered from its owner", "[cpu]") {
    // HSDP 2 x 2 with ep over dp_shard: the experts' replicas over dp_replicate are checked too
    // (every expert's gradient and parameter: 2 layers x 6 x 3, replicated over dp_replicate)
    CHECK(verified_experts({"moe_qwen2", "moe_qwen2_ep_hsdp", 1, nullptr}, ReplicaState::equal) ==
          2 * 6 * 3 * 2);  // every expert's gradient and parameter: 2 layers x 6 x 3
}

TEST_CASE("ep over HSDP's dp_replicate: fully_shard shards each rank's experts over dp_shard", "[cpu]") {
    RunInputs in;
    in.model_path = PTOOL_SOURCE_DIR "/models/moe_mixtral.yaml";
    in.model_text = read_text(in.model_path);
    const Model model = load_model_text(in.model_text, in.model_path);
    const auto plan = [](const char* ep) {
        return load_plan_text(fmt::format("mesh: {{dp_replicate: 2, dp_shard: 2}}\n"
                                          "data_parallel: {{mesh_dim: [dp_replicate, dp_shard], mode: "
                                          "fully_shard, fully_shard: ['layers.*']}}\n"
                                          "expert_parallel: {{mesh_dim: {}}}\n",
                                          ep),
                              "p.yaml");
    };
    std::vector<Diagnostic> warnings, causes;
    const DataParallelResolution outer = resolve_data_parallel(model, plan("dp_replicate"), warnings, causes);
    CHECK(outer.experts_sharded);
    std::vector<std::string> expert_units;
    for (const FsdpUnitSpec& u : outer.units)
        if (u.experts) {
            expert_units.push_back(u.fqn);
            CHECK(u.params.size() == 4 * 3);  // every expert's, each rank keeping its own
        }
    CHECK(expert_units == std::vector<std::string>{"layers.0.moe_block.block_sparse_moe.experts",
                                                   "layers.1.moe_block.block_sparse_moe.experts"});
    // ep over dp_shard: each rank's experts whole, as before
    CHECK_FALSE(resolve_data_parallel(model, plan("dp_shard"), warnings, causes).experts_sharded);

    // the memory: 2 of 4 experts per rank, then half of their rows (147456 B of experts in all)
    const auto params = [&](const Plan& p) {
        return simulate_rank(in, p, 0, 1).memory.at_peak[static_cast<size_t>(MemoryUse::parameters)];
    };
    CHECK(params(plan("dp_shard")) - params(plan("dp_replicate")) == 147456 / 2 - 147456 / 4);

    // the run: every expert tensor compared, gathered from its dp_shard shards and then its owner;
    // there are no replicas of an expert (sharded on dp_shard, owned on dp_replicate)
    CHECK(verified_experts({"moe_mixtral", "moe_mixtral_ep_fsdp", 1, nullptr}, ReplicaState::sharded) ==
          2 * 4 * 3 * 2);  // every expert's gradient and parameter: 2 layers x 4 x 3
}

TEST_CASE("explain's collectives under expert parallelism are the run's: a rank's own experts only",
          "[cpu]") {
    // each op's calls exactly; its bytes within the routing's imbalance (explain routes balanced: an
    // owned expert's rows are ep x a rank's tokens x top_k / experts, its tp collectives with them)
    for (const char* plan :
         {"moe_mixtral_ep", "moe_mixtral_ep_tp", "moe_qwen2_ep_hsdp", "moe_mixtral_ep_fsdp"}) {
        INFO(plan);
        const ShippedCase c{plan[4] == 'q' ? "moe_qwen2" : "moe_mixtral", plan, 1, nullptr};
        const VerifyJob job = shipped_job(c);
        const VerifyReport rep = verify(job, *in_process_launch(Device::cpu, CommOptions{}));
        REQUIRE(rep.plans.size() == 1);
        const Model model = load_model_text(job.inputs.model_text, job.inputs.model_path);
        std::map<Collective, CommTotals> derived;
        for (const CommCost& cc : explain_plan(model, job.plans[0]).step_comm)
            derived[cc.op].calls += 1, derived[cc.op].bytes += cc.bytes;
        const std::map<Collective, CommTotals> measured = rep.plans[0].run.step_counts.by_op();
        REQUIRE(derived.size() == measured.size());
        for (const auto& [op, m] : measured) {
            INFO(collective_name(op));
            REQUIRE(derived.count(op));
            CHECK(derived.at(op).calls == m.calls);
            CHECK(std::abs(static_cast<double>(derived.at(op).bytes - m.bytes)) <=
                  0.05 * static_cast<double>(m.bytes));
        }
    }
}

TEST_CASE("a pipeline stage that holds no moe layer runs under expert parallel", "[cpu]") {
    // two dense blocks, then two moe blocks; stage 0 holds the dense ones, stage 1 the experts
    // (sharded over dp_shard): the stage's own resolution finds no moe layer, which is no error
    VerifyJob job;
    job.inputs.model_path = "dense_then_moe.yaml";
    job.inputs.model_text = R"(name: dense_then_moe
batch:
  input: {tokens: [8, 8], vocab: 64}
modules:
  - {name: tok_embeddings, type: embedding, vocab: 64, dim: 32}
  - name: dense
    type: repeat
    count: 2
    modules:
      - {name: mlp, type: gated_mlp, dim: 32, hidden: 48}
  - name: layers
    type: repeat
    count: 2
    modules:
      - name: moe_block
        type: residual
        modules:
          - {name: ffn_norm, type: rms_norm, dim: 32}
          - {name: block_sparse_moe, type: moe, dim: 32, hidden: 48, experts: 4, top_k: 2}
  - {name: output, type: linear, in: 32, out: 64, bias: false}
loss: cross_entropy
optimizer: {type: adamw, lr: 0.001}
)";
    job.plans = {
        load_plan_text("mesh: {pp: 2, dp_replicate: 2, dp_shard: 2}\n"
                       "data_parallel: {mesh_dim: [dp_replicate, dp_shard], mode: fully_shard, "
                       "fully_shard: ['layers.*', 'dense.*']}\n"
                       "expert_parallel: {mesh_dim: dp_replicate}\n"
                       "pipeline_parallel: {mesh_dim: pp, microbatches: 2, split_points: [layers.0]}\n",
                       "p.yaml")};
    job.options.steps = 2;
    const VerifyReport rep = verify(job, *in_process_launch(Device::cpu, CommOptions{}));
    REQUIRE(rep.plans.size() == 1);
    CHECK(rep.pass);
    CHECK(rep.plans[0].passed > 100);
}

TEST_CASE("under a pipeline the step's loss carries every stage's balancing loss", "[cpu]") {
    // moe_mixtral (aux_loss_coef 0.02) on 2 stages, a moe layer each: stage 0's balancing loss is
    // summed into the last stage's loss (its gradient stays in stage 0's backward); the loss is
    // compared with the reference's, which has both layers' terms
    const ShippedCase c{"moe_mixtral", "moe_mixtral_ddp", 2, nullptr};
    VerifyJob job = shipped_job(c);
    job.plans = {
        load_plan_text("mesh: {pp: 2}\npipeline_parallel: {mesh_dim: pp, microbatches: 2}\n", "p.yaml")};
    const VerifyReport rep = verify(job, *in_process_launch(Device::cpu, CommOptions{}));
    REQUIRE(rep.plans.size() == 1);
    CHECK(rep.pass);
    int losses = 0;
    for (const TensorReport& t : rep.plans[0].tensors)
        if (t.name.find(".loss") != std::string::npos) losses += t.pass;
    CHECK(losses == 2);  // each step's
}

TEST_CASE("the plan search proposes expert parallel where the experts divide over the dp dim", "[cpu]") {
    // moe_qwen2: 6 experts per layer; 4 H100s: dp4 x tp1 (6 does not divide over 4), dp2 x tp2 (2 divides 6)
    const std::string path = PTOOL_SOURCE_DIR "/models/moe_qwen2.yaml";
    const Cluster c = load_cluster(PTOOL_SOURCE_DIR "/clusters/h100_8x8.yaml");
    SearchOptions o;
    o.world_size = 4;
    o.pipelines = "never";
    o.keep = 1000;
    const SearchResult r = search_plans(read_text(path), path, c, o);
    int ep = 0;
    for (const Candidate& k : r.fitting) {
        if (k.choice.ep <= 1) continue;
        INFO(k.plan_text);
        ++ep;
        CHECK(k.choice.ep == 2);
        CHECK(k.choice.tp == 2);
        CHECK_THAT(k.plan_text, Catch::Contains("expert_parallel:\n  mesh_dim: dp\n"));
        CHECK_THAT(k.plan_text, Catch::Contains("mlp.experts.*.[gu]*_proj\": colwise"));
        CHECK(k.time.all_to_all > 0);  // blocking: part of the step
        CHECK(k.time.blocking >= k.time.all_to_all);
        CHECK(k.choice.mode_name().find("+ep2") != std::string::npos);
    }
    CHECK(ep > 0);
    int refused = 0;
    for (const Rejection& j : r.rejected)
        refused += j.reason.find("has 6 experts, which do not divide over ep=4") != std::string::npos;
    CHECK(refused > 0);

    // on two nodes of 2 (HSDP: dp_shard inside a node), moe_mixtral's 4 experts: ep over dp_shard
    // (each rank's experts whole) and over dp_replicate (sharded over dp_shard), and the latter verifies
    const std::string mixtral = PTOOL_SOURCE_DIR "/models/moe_mixtral.yaml";
    const SearchResult two = search_plans(read_text(mixtral), mixtral,
                                          load_cluster(PTOOL_SOURCE_DIR "/tests/data/cpu_2x2.yaml"), o);
    const Candidate* outer = nullptr;
    int inner = 0;
    for (const Candidate& k : two.fitting) {
        if (k.choice.ep <= 1 || !k.choice.hybrid()) continue;
        INFO(k.plan_text);
        CHECK(k.choice.ep == 2);
        CHECK_THAT(k.plan_text,
                   Catch::Contains(k.choice.ep_replicate ? "expert_parallel:\n  mesh_dim: dp_replicate\n"
                                                         : "expert_parallel:\n  mesh_dim: dp_shard\n"));
        CHECK(k.choice.mode_name() == (!k.choice.ep_replicate ? "hsdp+ep2"
                                       : k.choice.ep_inner    ? "hsdp+ep2r-inner"
                                                              : "hsdp+ep2r"));
        // dp_replicate, which ep borrows, inner (ep inside a node) or outer on the mesh
        CHECK_THAT(k.plan_text, Catch::Contains(k.choice.ep_replicate && k.choice.ep_inner
                                                    ? "mesh: {dp_shard: 2, dp_replicate: 2}"
                                                    : "mesh: {dp_replicate: 2, dp_shard: 2}"));
        if (k.choice.ep_replicate && !outer) outer = &k;
        inner += !k.choice.ep_replicate;
    }
    CHECK(inner > 0);
    REQUIRE(outer != nullptr);
    VerifyJob job;
    job.inputs.model_path = mixtral, job.inputs.model_text = read_text(mixtral);
    job.plans = {load_plan_text(outer->plan_text, "planned.yaml")};
    job.options.steps = 1;
    CHECK(verify(job, *in_process_launch(Device::cpu, CommOptions{})).pass);
}

TEST_CASE("an expert capacity drops the slots over it, in the microbatch's token order", "[cpu]") {
    // moe_qwen3 (8 experts, top-4, capacity_factor 1.0): some slots drop; a capacity no expert reaches
    // is dropless, bitwise; and the drops are the microbatch's under expert parallelism too
    const std::string path = PTOOL_SOURCE_DIR "/models/moe_qwen3.yaml";
    const std::string text = read_text(path);
    auto loss = [&](const std::string& model_text) {
        RunInputs in;
        in.model_path = path, in.model_text = model_text;
        const RunRecord rec = record_reference(in, single_device_plan(), 1, RecordOptions{});
        return find_tensor(rec.steps.at(0), "step0.loss")->item(0);
    };
    const std::string dropless = std::regex_replace(text, std::regex(", capacity_factor: 1.0"), "");
    const std::string roomy =
        std::regex_replace(text, std::regex("capacity_factor: 1.0"), "capacity_factor: 100");
    REQUIRE(dropless != text);
    CHECK(loss(roomy) == loss(dropless));
    CHECK(loss(text) != loss(dropless));
    const VerifyReport rep = verify(shipped_job({"moe_qwen3", "moe_mixtral_ep", 1, nullptr}),
                                    *in_process_launch(Device::cpu, CommOptions{}));
    REQUIRE(rep.plans.size() == 1);
    CHECK(rep.pass);
}

}  // namespace test_expert_parallel
