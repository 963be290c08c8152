// The op-case table (op_cases.h) on every machine: each op of backend.h's Backend has a row; every
// case runs on the CPU with finite outputs, the same on a second run; the meta backend runs every
// case with the CPU's output shapes and dtypes and counts its work (what the planner's simulations
// price); the comparison test_cuda_backend holds the GPU to finds what it must.
#include <algorithm>
#include <cmath>
#include <map>

#include "attention_oracle.h"
#include "backend/meta/meta_backend.h"
#include "op_cases.h"
#include "test_helpers.h"

using namespace ptool;
using namespace ptool::testing;

namespace test_op_cases {

namespace {

// body(row, dtype, case) for every case of the table
template <class F>
void each_case(F&& body) {
    for (const OpRow& row : op_table())
        for (DType dt : kOpDtypes)
            for (const OpCase& c : row.cases(dt)) body(row, dt, c);
}

std::string what(const OpRow& row, DType dt, const OpCase& c) {
    return row.op + " " + dtype_name(dt) + " " + c.label;
}

}  // namespace

TEST_CASE("every op of backend.h has a row in the op-case table, and every row names one", "[cpu]") {
    const std::vector<std::string> virtuals =
        backend_virtuals(read_text(PTOOL_SOURCE_DIR "/engine/backend/backend.h"));
    REQUIRE(std::find(virtuals.begin(), virtuals.end(), "gemm") != virtuals.end());  // the parse found them
    REQUIRE(std::find(virtuals.begin(), virtuals.end(), "adamw_step") != virtuals.end());
    std::map<std::string, int> rows;
    for (const OpRow& row : op_table()) ++rows[row.op];
    for (const std::string& name : virtuals) {
        if (backend_queries().count(name)) continue;
        INFO("Backend::" << name
                         << " has no row in tests/op_cases_*.cpp (docs/testing.md: the op-case table)");
        CHECK((rows.count(name) ? rows.at(name) : 0) == 1);
    }
    for (const OpRow& row : op_table())
        for (DType dt : kOpDtypes) {
            INFO(row.op << " in " << dtype_name(dt));
            CHECK(!row.cases(dt).empty());
        }
    for (const auto& [op, n] : rows) {
        INFO("the table's row '" << op << "' (" << n << " of them)");
        CHECK(n == 1);
        CHECK(std::find(virtuals.begin(), virtuals.end(), op) != virtuals.end());
        CHECK(backend_queries().count(op) == 0);
    }
    for (const std::string& q : backend_queries()) {
        INFO("backend_queries() names " << q << ", which backend.h's Backend does not declare");
        CHECK(std::find(virtuals.begin(), virtuals.end(), q) != virtuals.end());
    }
    CHECK(rows.size() + backend_queries().size() == virtuals.size());
}

TEST_CASE("every op case runs on the cpu with finite outputs, the same on a second run", "[cpu]") {
    Backend& cpu = backend_for(Device::cpu);
    int cases = 0;
    each_case([&](const OpRow& row, DType dt, const OpCase& c) {
        INFO(what(row, dt, c));
        OpRun first = c.setup(cpu), second = c.setup(cpu);
        first.op(), second.op();
        const std::vector<OpOutput> a = first.outputs(), b = second.outputs();
        REQUIRE(!a.empty());
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) {
            int64_t bad = 0;
            for (int64_t j = 0; j < a[i].value.numel(); ++j) {
                const double x = a[i].value.item(j);
                bad += a[i].tol.finite ? !std::isfinite(x) : std::isnan(x) || x == INFINITY;
            }
            INFO(a[i].name << ": " << bad << " of " << a[i].value.numel() << " elements not finite");
            CHECK(bad == 0);
            const OpComparison cmp = compare_output(a[i], b[i].value, a[i].name);
            INFO(cmp.message);
            CHECK(cmp.bad == 0);
        }
        ++cases;
    });
    CHECK(cases > 100);
}

TEST_CASE("the meta backend runs every op case with the cpu's output shapes and dtypes and counts its work",
          "[cpu]") {
    Backend &cpu = backend_for(Device::cpu), &meta = backend_for(Device::meta);
    each_case([&](const OpRow& row, DType dt, const OpCase& c) {
        INFO(what(row, dt, c));
        OpRun on_cpu = c.setup(cpu), on_meta = c.setup(meta);
        on_cpu.op();
        const MetaWork before = meta_work();
        on_meta.op();
        const MetaWork work = work_since(before, meta_work());
        const std::vector<OpOutput> want = on_cpu.outputs(), got = on_meta.outputs();
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            INFO(want[i].name << ": cpu " << dtype_name(want[i].value.dtype()) << " "
                              << shape_str(want[i].value.shape()) << ", meta "
                              << dtype_name(got[i].value.dtype()) << " " << shape_str(got[i].value.shape()));
            CHECK(got[i].name == want[i].name);
            CHECK(got[i].value.shape() == want[i].value.shape());
            CHECK(got[i].value.dtype() == want[i].value.dtype());
            if (want[i].value.dim() > 0)
                CHECK(got[i].value.device() == Device::meta);  // not a returned value
        }
        INFO("meta counted " << work.gemm_flops << " FLOPs, " << work.memory_bytes << " bytes ("
                             << (row.meta_counts_nothing.empty()
                                     ? "it must count some"
                                     : "it counts none: " + row.meta_counts_nothing)
                             << ")");
        CHECK((work.gemm_flops + work.memory_bytes > 0) == row.meta_counts_nothing.empty());
    });
}

TEST_CASE(
    "the op-case comparison finds an element out of tolerance, a flipped bit and a row sum beyond its bound",
    "[cpu]") {
    const Tensor ref = Tensor::from_doubles({4}, DType::float32, {1.0, -INFINITY, NAN, 3.0});
    CHECK(compare_output({"x", ref, {}}, ref.clone(), "x").bad == 0);  // -inf and NaN match themselves
    const Tensor off = Tensor::from_doubles({4}, DType::float32, {1.0, -INFINITY, NAN, 3.001});
    const OpComparison c = compare_output({"x", ref, {}}, off, "x");
    CHECK(c.bad == 1);
    CHECK(std::abs(c.worst - 0.001) < 1e-6);
    CHECK(c.message.find("x in float32: 1 of 4 elements out of tolerance") != std::string::npos);
    CHECK(compare_output({"x", ref, {}}, Tensor({5}, DType::float32), "x").bad == 1);  // another shape

    const Tensor bits = Tensor::from_doubles({2}, DType::float32, {0.5, 0.25});
    Tensor flipped = bits.clone();
    flipped.data<float>()[1] = std::nextafter(0.25f, 1.0f);  // inside rtol_of, one bit away
    const OpTolerance bitwise{.kind = OpTolerance::Kind::bitwise};
    CHECK(compare_output({"t", bits, {}}, flipped, "t").bad == 0);
    CHECK(compare_output({"t", bits, bitwise}, flipped, "t").bad == 1);

    const Tensor m = Tensor::from_doubles({2}, DType::float32, {2.0, -INFINITY}),
                 l = Tensor::from_doubles({2}, DType::float32, {10.0, 0.0});
    const OpTolerance rows{.kind = OpTolerance::Kind::row_sums, .row_max = m, .keys = 100};
    const double bound = bf16_row_sum_bound(2.0, 10.0, 100);
    CHECK(compare_output({"l", l, rows}, Tensor::from_doubles({2}, DType::float32, {10.0 + bound / 2, 0.0}),
                         "l")
              .bad == 0);
    CHECK(compare_output({"l", l, rows}, Tensor::from_doubles({2}, DType::float32, {10.0 + bound * 2, 0.0}),
                         "l")
              .bad == 1);
    CHECK(compare_output({"l", l, rows}, Tensor::from_doubles({2}, DType::float32, {10.0, 1e-30}), "l").bad ==
          1);  // a row that sees no key: 0 exactly
}

}  // namespace test_op_cases
