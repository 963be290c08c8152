// DDP's bucket assignment and coverage, and the data-parallel resolution of shipped plans.
#include <catch2/catch.hpp>
#include <map>

#include "comm/comm_threads.h"
#include "parallel/parallelize.h"

using namespace ptool;

namespace test_data_parallel {

namespace {

Model load(const std::string& name) {
    return load_model(PTOOL_SOURCE_DIR "/models/" + name + ".yaml");
}

Plan plan_text(const std::string& text) {
    return load_plan_text(text, "test_plan.yaml");
}

}  // namespace

TEST_CASE("assign_buckets fills in reverse order and closes a bucket once it reaches the cap") {
    // a: 40 B, b: 40 B, c: 100 B, d: 8 B with a 64 B cap: d+c reach it (108), then b+a (80)
    const auto buckets = assign_buckets({{"a", 40}, {"b", 40}, {"c", 100}, {"d", 8}}, 64);
    REQUIRE(buckets.size() == 2);
    CHECK(buckets[0].params == std::vector<std::string>{"d", "c"});
    CHECK(buckets[0].bytes == 108);
    CHECK(buckets[1].params == std::vector<std::string>{"b", "a"});
    // a parameter over the cap closes its bucket at once; a huge cap is one bucket
    CHECK(assign_buckets({{"a", 1}, {"b", 500}}, 64).size() == 2);
    CHECK(assign_buckets({{"a", 500}, {"b", 1}}, 64).size() == 1);
    CHECK(assign_buckets({{"a", 500}, {"b", 1}}, 1 << 30).size() == 1);
    CHECK(assign_buckets({}, 64).empty());
}

TEST_CASE("every synchronised parameter is in exactly one bucket and ignored ones in none") {
    Model m = load("mlp_stacked_mse");
    for (const double cap_mb : {25.0, 0.001, 0.0001, 1e-7}) {
        for (const bool ignore : {false, true}) {
            const std::string text =
                fmt::format("mesh: {{dp: 2}}\ndata_parallel:\n  mesh_dim: dp\n  bucket_cap_mb: {}\n{}",
                            cap_mb, ignore ? "  ignored_modules: [layers.0.net1]\n" : "");
            std::vector<Diagnostic> warnings, causes;
            const DataParallelResolution res = resolve_data_parallel(m, plan_text(text), warnings, causes);
            std::map<std::string, int> seen;
            int64_t bytes = 0;
            const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(cap_mb * 1024 * 1024));
            for (const auto& replica : res.replicas)
                for (const BucketSpec& b : replica.buckets) {
                    for (const auto& p : b.params) seen[p] += 1;
                    bytes += b.bytes;
                    // a bucket closes at the cap: without its last parameter it was under it
                    int64_t last = 0;
                    for (const auto& [name, p] : m.named_parameters())
                        if (name == b.params.back()) last = static_cast<int64_t>(p->value.nbytes());
                    CHECK(b.bytes - last < cap);
                }
            int64_t expected = 0;
            for (const auto& [name, p] : m.named_parameters()) {
                const bool ignored = ignore && name.rfind("layers.0.net1.", 0) == 0;
                CHECK(seen[name] == (ignored ? 0 : 1));
                CHECK(res.ignored_params.count(name) == (ignored ? 1u : 0u));
                if (!ignored) expected += static_cast<int64_t>(p->value.nbytes());
            }
            CHECK(bytes == expected);
        }
    }
}

TEST_CASE("fully_shard units own the parameters of their subtree less inner units'") {
    Model m = load("toy_model");
    std::vector<Diagnostic> warnings, causes;
    const auto res = resolve_data_parallel(
        m,
        plan_text("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  fully_shard: [\"linears.*\", linears]\n"),
        warnings, causes);
    std::map<std::string, std::vector<std::string>> owned;
    for (const auto& u : res.units) owned[u.fqn] = u.params;
    CHECK(owned["linears"].empty());
    CHECK(owned["linears.0"] == std::vector<std::string>{"linears.0.weight"});
    CHECK(owned["linears.2"] == std::vector<std::string>{"linears.2.weight"});
    REQUIRE(res.replicas.size() == 1);  // replicate() takes only what fully_shard left: proj
    REQUIRE(res.replicas[0].buckets.size() == 1);
    CHECK(res.replicas[0].buckets[0].params == std::vector<std::string>{"proj.weight"});
}

TEST_CASE("the data-parallel lint's warnings and causes carry their plan location and message as data") {
    Model m = load("mlp_stacked");  // loss: sum
    std::vector<Diagnostic> warnings, causes;
    const Plan plan = plan_text(
        "mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  mode: fully_shard\n  fully_shard: [nope]\n");
    resolve_data_parallel(m, plan, warnings, causes);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].where.file == "test_plan.yaml");
    CHECK(warnings[0].where.line == 5);
    CHECK(warnings[0].message == "fully_shard pattern 'nope' matched no module");
    CHECK(warnings[0].str() == warnings[0].where.str() + ": fully_shard pattern 'nope' matched no module");
    REQUIRE(causes.size() == 1);
    CHECK(causes[0].where.line == 3);  // the data_parallel section
    CHECK(causes[0].message.rfind("loss: sum under data parallel: ", 0) == 0);
    CHECK(Diagnostic{{}, "no place"}.str() == "no place");
}

TEST_CASE("one all_reduce per bucket per step, counted on the dp dim") {
    Model probe = load("mlp_stacked_mse");
    const Plan plan = plan_text("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  bucket_cap_mb: 0.0005\n");
    std::vector<Diagnostic> warnings, causes;
    const auto res = resolve_data_parallel(probe, plan, warnings, causes);
    REQUIRE(res.replicas[0].buckets.size() > 2);
    int64_t measured[2] = {0, 0};
    std::vector<double> averaged[2];  // Catch2 assertions are not thread-safe: checked after the join
    run_rank_threads(2, CommOptions{}, [&](Communicator& world) {
        Model m = load("mlp_stacked_mse");
        auto counter = std::make_shared<CommCounter>();
        DeviceMesh mesh(plan.mesh(), world, counter);
        DataParallel dp(m, plan, res, mesh, mesh.comm(0), backend_for(Device::cpu));
        counter->reset();
        for (const auto& [name, p] : m.named_parameters())
            backend_for(Device::cpu).fill(p->grad, world.rank() + 1.0);
        dp.after_backward();
        for (const auto& [key, t] : counter->entries())
            if (std::get<0>(key) == Collective::all_reduce && std::get<1>(key) == "dp")
                measured[world.rank()] += t.calls;
        for (const auto& [name, p] : m.named_parameters()) averaged[world.rank()].push_back(p->grad.item(0));
    });
    for (const auto& rank : averaged)
        for (double g : rank) CHECK(g == 1.5);  // (1 + 2) / 2 on both ranks
    CHECK(measured[0] == static_cast<int64_t>(res.replicas[0].buckets.size()));
    CHECK(measured[1] == measured[0]);
}

}  // namespace test_data_parallel
