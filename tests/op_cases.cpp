// The op-case table assembled from its families, the comparison of a backend's output with the
// CPU's, and the inputs every case draws (op_cases.h).
#include "op_cases.h"

#include <cmath>
#include <cstring>
#include <regex>

#include "attention_oracle.h"
#include "close_enough.h"
#include "core/rng.h"

namespace ptool::testing {

double rtol_of(DType dt) {
    return dt == DType::float64 ? 1e-12 : dt == DType::bfloat16 ? 1.6e-2 : 1e-5;
}

const std::vector<OpRow>& op_table() {
    static const std::vector<OpRow> table = [] {
        std::vector<OpRow> t;
        for (auto family : {gemm_rows, elementwise_rows, exact_rows, norm_rows, softmax_rows, attention_rows,
                            loss_optimizer_rows})
            for (OpRow& r : family()) t.push_back(std::move(r));
        return t;
    }();
    return table;
}

const std::set<std::string>& backend_queries() {
    static const std::set<std::string> q{"device", "name", "synchronize", "fused_attention"};
    return q;
}

// Each `virtual` in class Backend's body up to its '(' ends in the member's name; the body ends at
// the first "};" (backend.h declares no nested types in it).
std::vector<std::string> backend_virtuals(const std::string& header_text) {
    const size_t start = header_text.find("class Backend {");
    if (start == std::string::npos) return {};
    const std::string body = header_text.substr(start, header_text.find("\n};", start) - start);
    static const std::regex virtual_member(R"(virtual\s+[^;(]*?~?(\w+)\s*\()");
    std::vector<std::string> names;
    for (auto it = std::sregex_iterator(body.begin(), body.end(), virtual_member);
         it != std::sregex_iterator(); ++it)
        if ((*it)[1] != "Backend") names.push_back((*it)[1]);
    return names;
}

namespace {

OpComparison compare_rows(const OpOutput& ref, const Tensor& g, const std::string& what) {
    OpComparison c;
    c.total = ref.value.numel();
    for (int64_t i = 0; i < c.total; ++i) {
        const double err = std::abs(ref.value.item(i) - g.item(i)),
                     bound = bf16_row_sum_bound(ref.tol.row_max.item(i), ref.value.item(i), ref.tol.keys);
        if (!(err <= bound))
            ++c.bad, c.worst = std::isnan(err) || err / bound > c.worst ? err / bound : c.worst;
    }
    c.message =
        fmt::format("{} (bfloat16 scores): {} of {} rows beyond the derived bound, worst at {} x the bound",
                    what, c.bad, c.total, c.worst);
    return c;
}

}  // namespace

// The worst difference is NaN where one side is NaN (std::max would drop it: close_enough.h).
OpComparison compare_output(const OpOutput& ref, const Tensor& value, const std::string& what) {
    const Tensor g = value.to_device(Device::cpu);
    OpComparison c;
    if (g.shape() != ref.value.shape() || g.dtype() != ref.value.dtype()) {
        c.bad = c.total = 1;
        c.message =
            fmt::format("{}: {} {} against the reference's {} {}", what, dtype_name(g.dtype()),
                        shape_str(g.shape()), dtype_name(ref.value.dtype()), shape_str(ref.value.shape()));
        return c;
    }
    if (ref.tol.kind == OpTolerance::Kind::row_sums) return compare_rows(ref, g, what);
    c.total = ref.value.numel();
    if (ref.tol.kind == OpTolerance::Kind::bitwise) {
        const size_t size = dtype_size(g.dtype());
        for (int64_t i = 0; i < c.total; ++i)
            c.bad += std::memcmp(static_cast<const char*>(ref.value.raw()) + i * size,
                                 static_cast<const char*>(g.raw()) + i * size, size) != 0;
        c.message = fmt::format("{} in {}: {} of {} elements differ in their bits", what,
                                dtype_name(g.dtype()), c.bad, c.total);
        return c;
    }
    const double rtol = ref.tol.rtol >= 0 ? ref.tol.rtol : rtol_of(ref.value.dtype());
    for (int64_t i = 0; i < c.total; ++i) {
        const double a = ref.value.item(i), b = g.item(i), err = std::abs(a - b);
        if (!close_enough(a, b, ref.tol.atol, rtol))
            ++c.bad, c.worst = std::isnan(err) || err > c.worst ? err : c.worst;
    }
    c.message = fmt::format("{} in {}: {} of {} elements out of tolerance, worst {}", what,
                            dtype_name(ref.value.dtype()), c.bad, c.total, c.worst);
    return c;
}

Tensor uniform_tensor(const Shape& s, DType dt, uint64_t seed, double lo, double hi) {
    CounterRng rng(seed, 7);
    Tensor t(s, dt);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, lo + (hi - lo) * rng.uniform(static_cast<uint64_t>(i)));
    return t;
}

Tensor id_tensor(const Shape& s, int64_t vocab, uint64_t seed) {
    CounterRng rng(seed, 9);
    Tensor t(s, DType::int64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = static_cast<int64_t>(rng.below(i, vocab));
    return t;
}

Tensor place(Backend& be, const Tensor& host) {
    return be.device() == Device::cpu ? host : host.to_device(be.device());
}

Backend& host_backend() {
    return backend_for(Device::cpu);
}

}  // namespace ptool::testing
