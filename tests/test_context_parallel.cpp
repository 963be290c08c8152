// Context parallelism's units: which positions a cp rank holds (load-balanced or not), the
// conversions between cp order and position order, the plan section's parsing and refusals, and
// the ring's blocked softmax (backend.h's softmax_stats / merge / from_stats / backward_rows), and
// the ring's steps as events beside the reference's (model/modules/attention_ring_probe.cpp).
#include <algorithm>
#include <cmath>
#include <set>

#include "backend/backend.h"
#include "model/context_shard.h"
#include "parallel/plan.h"
#include "same_runs.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_context_parallel {

namespace {

Tensor iota(const Shape& shape) {
    Tensor t(shape, DType::float32);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
    return t;
}

bool same(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape()) return false;
    for (int64_t i = 0; i < a.numel(); ++i)
        if (a.item(i) != b.item(i)) return false;
    return true;
}

}  // namespace

TEST_CASE("a cp rank's positions: chunk r, or chunks r and 2cp-1-r load-balanced", "[cpu]") {
    const ContextShard plain0 = ContextShard::make(8, 2, 0, false, RotateMethod::allgather, nullptr),
                       plain1 = ContextShard::make(8, 2, 1, false, RotateMethod::allgather, nullptr);
    CHECK(plain0.positions == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(plain1.positions == std::vector<int64_t>{4, 5, 6, 7});
    std::vector<std::vector<int64_t>> balanced;
    for (int r = 0; r < 4; ++r)
        balanced.push_back(ContextShard::make(16, 4, r, true, RotateMethod::allgather, nullptr).positions);
    CHECK(balanced[0] == std::vector<int64_t>{0, 1, 14, 15});
    CHECK(balanced[1] == std::vector<int64_t>{2, 3, 12, 13});
    CHECK(balanced[3] == std::vector<int64_t>{6, 7, 8, 9});
    // every position on exactly one rank, and each rank's share of the causal triangle the same
    std::vector<int> seen(16, 0);
    std::vector<int64_t> work;
    for (const auto& ps : balanced) {
        int64_t w = 0;
        for (int64_t p : ps) ++seen[static_cast<size_t>(p)], w += p + 1;
        work.push_back(w);
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    CHECK(std::all_of(work.begin(), work.end(), [&](int64_t w) { return w == work[0]; }));
    CHECK(ContextShard::pieces(4, true) == 8);
    CHECK(ContextShard::pieces(4, false) == 4);
    // one rank: the whole sequence, nothing balanced
    const ContextShard one = ContextShard::make(6, 1, 0, true, RotateMethod::allgather, nullptr);
    CHECK(one.local() == 6);
    CHECK_FALSE(one.load_balance);
}

TEST_CASE("cp order and position order convert both ways, take cuts a rank's tokens", "[cpu]") {
    const Tensor whole = iota({2, 8, 3});  // [rows, sequence, features]
    for (bool balance : {false, true}) {
        INFO("load_balance " << balance);
        std::vector<Tensor> pieces;
        for (int r = 0; r < 2; ++r)
            pieces.push_back(
                ContextShard::make(8, 2, r, balance, RotateMethod::allgather, nullptr).take(whole, 1));
        const ContextShard s = ContextShard::make(8, 2, 0, balance, RotateMethod::allgather, nullptr);
        const Tensor gathered = cat(pieces, 1);  // what an all_gather along the sequence gives
        CHECK(same(s.natural(gathered, 1), whole));
        CHECK(same(s.cp_ordered(whole, 1), gathered));
        for (int64_t t = 0; t < 4; ++t)  // rank 0's token t is position positions[t] of the whole
            CHECK(pieces[0].item(1 * 8 * 3 / 2 + t * 3) ==
                  whole.item(1 * 8 * 3 + s.positions[static_cast<size_t>(t)] * 3));
    }
}

TEST_CASE("context_parallel claims the cp role, its options and refusals", "[cpu]") {
    const Plan p = load_plan_text(
        "mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard}\n"
        "context_parallel: {mesh_dim: cp}\n",
        "p.yaml");
    CHECK(p.dims.index(DimRole::cp) == 1);
    CHECK(p.dims.size(DimRole::cp) == 2);
    REQUIRE(p.context_parallel);
    CHECK(p.context_parallel->load_balance);  // torch's default for causal attention
    CHECK(p.context_parallel->rotate == RotateMethod::allgather);
    CHECK(p.dims.cp_shards_params());                              // fully_shard over dp x cp
    CHECK(p.dims.param_nesting() == std::vector<int>{0, 1});       // the dp rows, then cp's of those
    CHECK(p.dims.group(GroupName::dp_shard_cp).label == "dp+cp");  // the flattened group's counter label
    CHECK(p.dims.counted_dims("dp+cp") == std::vector<int>{0, 1});
    const Plan ddp = load_plan_text(
        "mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp}\n"
        "context_parallel: {mesh_dim: cp, load_balance: false}\n",
        "p.yaml");
    CHECK_FALSE(ddp.dims.cp_shards_params());  // DDP: replicated over cp, the gradients averaged
    CHECK_FALSE(ddp.context_parallel->load_balance);
    CHECK(load_plan_text("mesh: {cp: 4}\ncontext_parallel: {}\n", "p.yaml").dims.index(DimRole::cp) == 0);

    CHECK(load_plan_text("mesh: {cp: 2}\ncontext_parallel: {rotate_method: alltoall}\n", "p.yaml")
              .context_parallel->rotate == RotateMethod::alltoall);
    CHECK(load_plan_text("mesh: {cp: 2}\ncontext_parallel: {}\n", "p.yaml").context_parallel->rotate ==
          RotateMethod::allgather);
    CHECK(plan_error("mesh: {cp: 2}\ncontext_parallel: {rotate_method: allgathr}\n").find("did you mean") !=
          std::string::npos);
    CHECK(plan_error("mesh: {dp: 2, cp: 2}\ncontext_parallel: {}\n")
              .find("'context_parallel' needs 'mesh_dim': the mesh has 2 dims") != std::string::npos);
    CHECK(plan_error(
              "mesh: {tp: 2}\ntensor_parallel: {mesh_dim: tp, plan: {}}\ncontext_parallel: {mesh_dim: tp}\n")
              .find("context_parallel and tensor_parallel both use mesh dim 'tp'") != std::string::npos);
    CHECK(plan_error("mesh: {cp: 2}\ncontext_parallel: {mesh_dim: cp, balance: true}\n").find("balance") !=
          std::string::npos);
}

TEST_CASE("the ring's blocked softmax: blocks merged by log-sum-exp are the whole row's softmax", "[cpu]") {
    // 3 rows of 7 keys in blocks of 3 and 4; row 1 sees none of the first block's keys (-inf there)
    Backend& be = backend_for(Device::cpu);
    const int64_t rows = 3, keys = 7, hd = 5, cut = 3;
    Tensor s({rows, keys}, DType::float64), v({keys, hd}, DType::float64), d_o({rows, hd}, DType::float64);
    for (int64_t i = 0; i < s.numel(); ++i) s.set(i, std::sin(1.7 * static_cast<double>(i)) * 4);
    for (int64_t j = 0; j < cut; ++j) s.set(1 * keys + j, -INFINITY);
    for (int64_t i = 0; i < v.numel(); ++i) v.set(i, std::cos(0.9 * static_cast<double>(i)));
    for (int64_t i = 0; i < d_o.numel(); ++i) d_o.set(i, std::sin(0.3 * static_cast<double>(i) + 1));
    Tensor p(s.shape(), DType::float64), o({rows, hd}, DType::float64);
    be.softmax(s, false, p);
    be.gemm(p, false, v, false, o);

    Tensor acc({rows, hd}, DType::float64), m({rows}, DType::float64), l({rows}, DType::float64);
    be.fill(m, -INFINITY);
    const std::vector<std::pair<int64_t, int64_t>> blocks{{0, cut}, {cut, keys - cut}};
    for (const auto& [k0, n] : blocks) {
        Tensor sb = s.narrow(1, k0, n), pb(sb.shape(), DType::float64), ob({rows, hd}, DType::float64),
               mb({rows}, DType::float64), lb({rows}, DType::float64);
        be.softmax_stats(sb, pb, mb, lb);
        be.gemm(pb, false, v.narrow(0, k0, n), false, ob);
        be.softmax_merge(acc, m, l, ob, mb, lb);
    }
    for (int64_t i = 0; i < o.numel(); ++i) CHECK(acc.item(i) == Approx(o.item(i)).epsilon(1e-12));

    // backward by blocks under the rows' final statistics: the whole softmax's probabilities and gradient
    Tensor dp({rows, keys}, DType::float64), ds(s.shape(), DType::float64);
    be.gemm(d_o, false, v, true, dp);
    be.softmax_backward(p, dp, ds);
    for (const auto& [k0, n] : blocks) {
        Tensor sb = s.narrow(1, k0, n), pb(sb.shape(), DType::float64), dsb(sb.shape(), DType::float64);
        be.softmax_from_stats(sb, m, l, pb);
        be.softmax_backward_rows(pb, dp.narrow(1, k0, n), acc, d_o, dsb);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < n; ++j) {
                CHECK(pb.item(r * n + j) == Approx(p.item(r * keys + k0 + j)).margin(1e-14));
                CHECK(dsb.item(r * n + j) == Approx(ds.item(r * keys + k0 + j)).margin(1e-12));
            }
    }
}

TEST_CASE("the ring's steps are events that meet the reference's: each agrees on a correct plan", "[cpu]") {
    // llama_rope_ring_cp4: two layers, two microbatches, cp 4 load-balanced. Per attention and microbatch the
    // ring reports its output after each of the 4 steps, its query gradient after each, and the key and value
    // gradients once home; the reference (given the plan's cp layout) reports the same names.
    const VerifyReport rep = verify(shipped_job({"llama_rope", "llama_rope_ring_cp4", 1, nullptr}),
                                    *in_process_launch(Device::cpu, CommOptions{}));
    REQUIRE(rep.pass);
    REQUIRE(rep.plans.size() == 1);
    const StepRecord& par = rep.plans[0].run.steps.at(0);
    const StepRecord& ref = rep.reference.steps.at(0);
    std::set<std::string> ref_parts;
    for (const ModuleEvent& e : ref.events)
        if (e.fqn.find('#') != std::string::npos) ref_parts.insert(event_key(e));
    std::set<std::string> parts;
    for (const ModuleEvent& e : par.events) {
        if (e.fqn.find('#') == std::string::npos) continue;
        INFO(event_key(e));
        REQUIRE(e.diff);  // met the reference's event of that name
        CHECK(e.diff->pass);
        CHECK_FALSE(e.diff->nonfinite);
        parts.insert(event_key(e));
    }
    CHECK(parts == ref_parts);
    CHECK(parts.size() == 2 * 2 * (4 + 4 + 2));
    for (int s = 0; s < 4; ++s) {
        CHECK(parts.count(fmt::format("0:0:0:layers.1.attn_block.attention#output at ring step {} of 4", s)));
        CHECK(parts.count(
            fmt::format("0:1:0:layers.0.attn_block.attention#query gradient at ring step {} of 4", s)));
    }
    CHECK(parts.count("1:1:0:layers.0.attn_block.attention#value gradient after the ring's return hop"));
}

}  // namespace test_context_parallel
