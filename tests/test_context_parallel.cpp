// Context parallelism's units: which positions a cp rank holds (load-balanced or not), the
// conversions between cp order and position order, and the plan section's parsing and refusals.
#include <algorithm>

#include "model/context_shard.h"
#include "parallel/plan.h"
#include "test_helpers.h"

using namespace ptool;

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

// The message of the InputError `text` raises as a plan, "" when it loads.
std::string plan_error(const std::string& text) {
    try {
        load_plan_text(text, "p.yaml");
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("a cp rank's positions: chunk r, or chunks r and 2cp-1-r load-balanced", "[cpu]") {
    const ContextShard plain0 = ContextShard::make(8, 2, 0, false, RotateMethod::allgather, nullptr),
                       plain1 = ContextShard::make(8, 2, 1, false, RotateMethod::allgather, nullptr);
    CHECK(plain0.positions == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(plain1.positions == std::vector<int64_t>{4, 5, 6, 7});
    std::vector<std::vector<int64_t>> balanced;
    for (int r = 0; r < 4; ++r) balanced.push_back(ContextShard::make(16, 4, r, true, RotateMethod::allgather, nullptr).positions);
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

TEST_CASE("cp order and position order convert both ways; take cuts a rank's tokens", "[cpu]") {
    const Tensor whole = iota({2, 8, 3});  // [rows, sequence, features]
    for (bool balance : {false, true}) {
        INFO("load_balance " << balance);
        std::vector<Tensor> pieces;
        for (int r = 0; r < 2; ++r)
            pieces.push_back(ContextShard::make(8, 2, r, balance, RotateMethod::allgather, nullptr).take(whole, 1));
        const ContextShard s = ContextShard::make(8, 2, 0, balance, RotateMethod::allgather, nullptr);
        const Tensor gathered = cat(pieces, 1);  // what an all_gather along the sequence gives
        CHECK(same(s.natural(gathered, 1), whole));
        CHECK(same(s.cp_ordered(whole, 1), gathered));
        for (int64_t t = 0; t < 4; ++t)  // rank 0's token t is position positions[t] of the whole
            CHECK(pieces[0].item(1 * 8 * 3 / 2 + t * 3) ==
                  whole.item(1 * 8 * 3 + s.positions[static_cast<size_t>(t)] * 3));
    }
}

TEST_CASE("context_parallel claims the cp role; its options and refusals", "[cpu]") {
    const Plan p = load_plan_text(
        "mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard}\n"
        "context_parallel: {mesh_dim: cp}\n",
        "p.yaml");
    CHECK(p.dims.index(DimRole::cp) == 1);
    CHECK(p.dims.size(DimRole::cp) == 2);
    REQUIRE(p.context_parallel);
    CHECK(p.context_parallel->load_balance);  // torch's default for causal attention
    CHECK(p.context_parallel->rotate == RotateMethod::allgather);
    CHECK(p.dims.cp_shards_params());                             // fully_shard over dp x cp
    CHECK(p.dims.param_nesting() == std::vector<int>{0, 1});      // the dp rows, then cp's of those
    CHECK(p.dims.label_dims("dp+cp") == std::vector<int>{0, 1});  // the flattened group's counter label
    const Plan ddp = load_plan_text(
        "mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp}\n"
        "context_parallel: {mesh_dim: cp, load_balance: false}\n",
        "p.yaml");
    CHECK_FALSE(ddp.dims.cp_shards_params());  // DDP: replicated over cp, the gradients averaged
    CHECK_FALSE(ddp.context_parallel->load_balance);
    CHECK(load_plan_text("mesh: {cp: 4}\ncontext_parallel: {}\n", "p.yaml").dims.index(DimRole::cp) == 0);

    CHECK(plan_error("mesh: {cp: 2}\ncontext_parallel: {rotate_method: alltoall}\n")
              .find("p.yaml:2:35: rotate_method 'alltoall' (ring attention): ptool does not run it yet") ==
          0);
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
