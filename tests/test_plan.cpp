// Planning units: rank classes over uneven shards, and the plan search being the same on any
// number of threads (it simulates candidates in parallel; TSan runs this file).
#include "plan/search.h"
#include "plan/simulate.h"
#include "test_helpers.h"

using namespace ptool;

TEST_CASE("rank classes follow torch.chunk's piece sizes", "[cpu]") {
    const std::string text = "batch: {input: [5, 8]}\nmodules:\n  - {name: fc, type: linear, in: 8, out: 8}\nloss: mean\n";
    MetaAllocation meta;
    const Model m = load_model_text(text, "m.yaml", "", false);
    const Plan plan = load_plan_text("mesh: {dp: 4}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n", "p.yaml");
    const std::vector<RankClass> classes = rank_classes(m, plan);
    REQUIRE(classes.size() == 3);  // rows 2, 2, 1, 0
    CHECK(classes[0].ranks == std::vector<int>{0, 1});
    CHECK(classes[1].ranks == std::vector<int>{2});
    CHECK(classes[2].ranks == std::vector<int>{3});
    const Plan even = load_plan_text("mesh: {dp: 4, tp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n"
                                     "tensor_parallel: {mesh_dim: tp, plan: {fc: colwise}}\n", "p.yaml");
    const Model m8 = load_model_text("batch: {input: [8, 8]}\nmodules:\n  - {name: fc, type: linear, in: 8, out: 8}\nloss: mean\n",
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
    for (size_t i = 0; i < one.rejected.size(); ++i) CHECK(one.rejected[i].reason == three.rejected[i].reason);
    for (size_t i = 0; i < one.fitting.size(); ++i) {
        INFO("candidate " << i);
        CHECK(one.fitting[i].plan_text == three.fitting[i].plan_text);
        CHECK(one.fitting[i].microbatches == three.fitting[i].microbatches);
        CHECK(one.fitting[i].peak == three.fitting[i].peak);
        CHECK(one.fitting[i].time.step == three.fitting[i].time.step);
    }
    for (size_t i = 1; i < one.fitting.size(); ++i) CHECK(one.fitting[i - 1].time.step <= one.fitting[i].time.step);
}

TEST_CASE("a 1-D mesh needs no mesh_dim; a 2-D mesh names it", "[cpu]") {
    const Plan tp = load_plan_text("mesh: {tp: 2}\ntensor_parallel:\n  plan: {net1: colwise}\n", "p.yaml");
    CHECK(tp.tp_mesh_dim == "tp");
    const Plan dp = load_plan_text("mesh: {dp: 4}\ndata_parallel: {mode: replicate}\n", "p.yaml");
    REQUIRE(dp.data_parallel);
    CHECK(dp.data_parallel->mesh_dim == "dp");
    CHECK_THROWS_WITH(load_plan_text("mesh: {dp: 2, tp: 2}\ndata_parallel: {mode: replicate}\n", "p.yaml"),
                      Catch::Contains("p.yaml:2:16: 'data_parallel' needs 'mesh_dim': the mesh has 2 dims (dp, tp)"));
    CHECK_THROWS_WITH(load_plan_text("mesh: {dp: 2}\ndata_parallel: {mode: replicate}\ntensor_parallel: {plan: {a: colwise}}\n", "p.yaml"),
                      Catch::Contains("both use mesh dim 'dp'"));
}
