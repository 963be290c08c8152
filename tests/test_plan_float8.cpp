// Float8 on a cluster and in the plan search (issue 48 item 4): a cluster's `tflops: {float8: ...}`
// is its float8 capability and the float8 GEMMs' peak; `ptool plan --float8` writes the float8
// section on every candidate, or offers each with and without it.
#include <set>

#include "plan/kernel_model.h"
#include "plan/kernel_table.h"
#include "plan/search.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_plan_float8 {

const std::string kSource = PTOOL_SOURCE_DIR;

std::string cluster_text(const std::string& tflops, const std::string& kernels = "") {
    return "name: c\nnodes: 1\ngpus_per_node: 8\nmemory_gib: 80\ntflops: " + tflops +
           "\nmemory_bandwidth_gb_s: 3350\ngemm_efficiency: 0.5\nintra_node: {bandwidth_gb_s: 450, "
           "latency_us: "
           "3}\n" +
           (kernels.empty() ? "" : "kernels: " + kernels + "\n");
}

MetaWork one_gemm(bool float8) {
    MetaWork w;
    GemmKey k{GemmOp::fwd, DType::bfloat16, 4096, 4096, 4096};
    k.float8 = float8;
    w.gemms[k] = 2;
    return w;
}

TEST_CASE("a cluster's float8 tflops is its float8 capability and its float8 GEMMs' peak", "[cpu]") {
    const Cluster h100 = load_cluster(kSource + "/clusters/h100_8x8.yaml");
    const Cluster h200 = load_cluster(kSource + "/clusters/h200_8x8.yaml");
    const Cluster a100 = load_cluster(kSource + "/clusters/a100_8x8.yaml");
    CHECK(h100.float8_flops == 1979e12);
    CHECK(h200.float8_flops == 1979e12);
    CHECK(h100.no_float8().empty());
    CHECK_FALSE(a100.has_float8());  // sm_80: no float8 tensor cores
    CHECK(a100.no_float8().find("'a100_8x8'") != std::string::npos);
    // the kernel tables' float8 rows are measured (the H200) or derived (the H100) against 1979
    CHECK(h100.kernels->float8_peak_flops == 1979e12);
    CHECK(h200.kernels->float8_peak_flops == 1979e12);

    // the roofline: a float8 GEMM's FLOPs at gemm_efficiency of the float8 peak, bf16's at bf16's
    const double flops = 2 * 2.0 * 4096 * 4096 * 4096;
    const Cluster roof = load_cluster_text(cluster_text("{bfloat16: 500, float8: 1200}"), "roof.yaml");
    CHECK(compute_terms(one_gemm(true), roof, DType::bfloat16).gemm[0] == Approx(flops / (0.5 * 1200e12)));
    CHECK(compute_terms(one_gemm(false), roof, DType::bfloat16).gemm[0] == Approx(flops / (0.5 * 500e12)));
    // a cluster without float8 tensor cores prices no float8 GEMM: it names itself and why
    const Cluster none = load_cluster_text(cluster_text("{bfloat16: 500}"), "none.yaml");
    require_input_error([&] { compute_terms(one_gemm(true), none, DType::bfloat16); },
                        {"none.yaml", "no float8 tensor cores", "no float8 entry"});
    CHECK(compute_terms(one_gemm(false), none, DType::bfloat16).gemm[0] > 0);

    // a table's float8 rows scale by the float8 peaks as its bf16 rows by bf16's: halving the
    // cluster's float8 peak doubles the float8 GEMM's seconds and leaves bf16's
    const std::string table = kSource + "/clusters/kernels/h100_sxm5_80gb.json";
    const Cluster full = load_cluster_text(cluster_text("{bfloat16: 989, float8: 1979}", table), "full.yaml");
    const Cluster half =
        load_cluster_text(cluster_text("{bfloat16: 989, float8: 989.5}", table), "half.yaml");
    const double f8 = compute_terms(one_gemm(true), full, DType::bfloat16).gemm[0];
    const double bf = compute_terms(one_gemm(false), full, DType::bfloat16).gemm[0];
    CHECK(f8 < 0.8 * bf);  // the table's float8 rows, not its bf16 ones
    CHECK(compute_terms(one_gemm(true), half, DType::bfloat16).gemm[0] == Approx(2 * f8).epsilon(1e-12));
    CHECK(compute_terms(one_gemm(false), half, DType::bfloat16).gemm[0] == Approx(bf).epsilon(1e-12));
    CHECK(kernel_model_source(half).find("float8 x0.500") != std::string::npos);
    CHECK(kernel_model_source(full).find("measured") == 0);
}

TEST_CASE("a kernel table with float8 rows names its float8 peak", "[cpu]") {
    const std::string rows =
        R"("gemm": [{"dtype": "bfloat16", "op": "fwd", "m": 1, "n": 1, "k": 1, "seconds": 1},
           {"dtype": "bfloat16", "float8": "tensorwise", "op": "fwd", "m": 1, "n": 1, "k": 1, "seconds": 1}],
  "memory": [{"op": "copy", "dtype": "bfloat16", "elements": 1, "bytes": 4, "seconds": 1}]})";
    const std::string head = R"({"format": "ptool kernel table 1", "gpu": "g", "peak": {"tflops": )";
    require_input_error(
        [&] {
            load_kernel_table_text(head + R"({"bfloat16": 1}, "memory_bandwidth_gb_s": 1},)" + "\n" + rows,
                                   "k.json");
        },
        {"k.json:1:", "'peak' gives no 'tflops' for float8"});
    const KernelTable t = load_kernel_table_text(
        head + R"({"bfloat16": 1, "float8": 2}, "memory_bandwidth_gb_s": 1},)" + "\n" + rows, "k.json");
    CHECK(t.float8_peak_flops == 2e12);
    CHECK(t.peak_flops.count(DType::bfloat16));
}

SearchResult search(Float8Search float8, const std::string& cluster = "h100_8x8", int world = 4) {
    const std::string path = kSource + "/models/llama_rope.yaml";
    SearchOptions o;
    o.world_size = world;
    o.float8 = float8;
    o.threads = 2;
    return search_plans(read_text(path), path, load_cluster(kSource + "/clusters/" + cluster + ".yaml"), o);
}

bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// What a candidate is besides float8 (the same mesh, data parallel, checkpointing and schedule).
std::string shape(const Candidate& c) {
    return fmt::format("{} {} {} {}", c.choice.mesh_text(), c.choice.mode_name(), c.choice.checkpoint_mode(),
                       c.choice.pp_text());
}

TEST_CASE("plan --float8 never proposes no float8, tensorwise proposes it on every candidate", "[cpu]") {
    const SearchResult never = search(Float8Search::never);
    REQUIRE(never.fitting.size() >= 4);
    for (const Candidate& c : never.fitting) {
        CHECK_FALSE(c.choice.float8);
        CHECK_FALSE(has(c.plan_text, "float8"));
        CHECK_FALSE(has(c.plan_text, "compile"));
    }
    const SearchResult tw = search(Float8Search::tensorwise);
    REQUIRE(tw.fitting.size() == never.fitting.size());  // the same shapes fit (the model is tiny)
    int gathered = 0, plain = 0;
    for (const Candidate& c : tw.fitting) {
        INFO(c.plan_text);
        CHECK(c.choice.float8 == Float8Scaling::tensorwise);
        CHECK(has(c.plan_text, "float8:\n  recipe: tensorwise\n"));
        CHECK(has(c.plan_text, "compile: true\n"));
        CHECK_FALSE(has(c.plan_text, "filter_fqns"));  // torchtitan's default: the output head left out
        const Plan p = load_plan_text(c.plan_text, "generated.yaml");
        REQUIRE(p.float8);
        CHECK(p.compile);
        // the float8 all-gather exactly where fully_shard shards over more than one dp rank
        const bool sharded = c.choice.dp_mode == DataParallelMode::fully_shard && c.choice.dp > 1;
        CHECK(p.float8->fsdp_float8_all_gather == sharded);
        CHECK(p.float8->precompute_scale == sharded);
        (sharded ? gathered : plain) += 1;
    }
    CHECK(gathered > 0);
    CHECK(plain > 0);
}

TEST_CASE("plan --float8 offer ranks each candidate with and without float8", "[cpu]") {
    const SearchResult never = search(Float8Search::never);
    const SearchResult offer = search(Float8Search::offer);
    REQUIRE(offer.fitting.size() == 2 * never.fitting.size());
    std::multiset<std::string> with, without;
    for (const Candidate& c : offer.fitting) (c.choice.float8 ? with : without).insert(shape(c));
    CHECK(with == without);  // each shape both ways
    std::multiset<std::string> before;
    for (const Candidate& c : never.fitting) before.insert(shape(c));
    CHECK(without == before);
    for (size_t i = 1; i < offer.fitting.size(); ++i)
        CHECK(offer.fitting[i - 1].time.step <= offer.fitting[i].time.step);
    // without float8 the candidates are never's, number for number
    for (const Candidate& n : never.fitting) {
        bool found = false;
        for (const Candidate& c : offer.fitting)
            if (!c.choice.float8 && c.plan_text == n.plan_text) {
                found = true;
                CHECK(c.time.step == n.time.step);
                CHECK(c.peak == n.peak);
            }
        CHECK(found);
    }
    // and the float8 twin is priced apart: its casts and float8 GEMMs change the step
    for (const Candidate& c : offer.fitting)
        if (c.choice.float8)
            for (const Candidate& n : never.fitting)
                if (shape(n) == shape(c)) CHECK(c.time.step != n.time.step);
}

TEST_CASE("plan --float8 rowwise on every mesh, and no float8 on a cluster without it", "[cpu]") {
    const SearchResult rw = search(Float8Search::rowwise);
    const SearchResult never = search(Float8Search::never);
    REQUIRE(rw.fitting.size() == never.fitting.size());  // rowwise is built under tp too
    bool tp2 = false;
    for (const Candidate& c : rw.fitting) {
        INFO(c.plan_text);
        tp2 |= c.choice.tp == 2;
        CHECK(has(c.plan_text, "float8:\n  recipe: rowwise\n"));
        CHECK_FALSE(has(c.plan_text, "enable_fsdp_float8_all_gather"));  // tensorwise only (torchao)
        const Plan p = load_plan_text(c.plan_text, "generated.yaml");
        REQUIRE(p.float8);
        CHECK(p.float8->recipe.scaling == Float8Scaling::rowwise);
    }
    CHECK(tp2);
    require_input_error([] { search(Float8Search::tensorwise, "a100_8x8"); },
                        {"--float8 tensorwise", "'a100_8x8'", "no float8 tensor cores"});
    require_input_error([] { search(Float8Search::offer, "cpu_local"); }, {"'cpu_local'", "no float8 entry"});
    CHECK_FALSE(search(Float8Search::never, "a100_8x8").fitting.empty());
}

}  // namespace test_plan_float8
