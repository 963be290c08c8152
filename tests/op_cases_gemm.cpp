// The op-case table's GEMM row (op_cases.h): every transpose, b shared by a batch of 3, alpha and
// beta both in play.
#include <fmt/format.h>

#include "op_cases.h"

namespace ptool::testing {

namespace op_cases_gemm {
namespace {

std::vector<OpCase> gemm_cases(DType dt) {
    std::vector<OpCase> cases;
    const int64_t batch = 3, m = 33, n = 47, k = 129;
    const OpTolerance tol{.atol = dt == DType::bfloat16 ? 1e-1 : 1e-4};
    for (const bool ta : {false, true})
        for (const bool tb : {false, true}) {
            OpCase c;
            c.label = fmt::format("c [{}, {}, {}] k {} ta={} tb={}", batch, m, n, k, int(ta), int(tb));
            c.gemm = GemmShape{batch, m, n, k, ta, tb};
            c.setup = [=](Backend& be) {
                const Tensor a =
                    place(be, uniform_tensor(ta ? Shape{batch, k, m} : Shape{batch, m, k}, dt, 1));
                const Tensor b = place(be, uniform_tensor(tb ? Shape{n, k} : Shape{k, n}, dt, 2));  // shared
                Tensor out = place(be, uniform_tensor({batch, m, n}, dt, 3));
                return OpRun{[=, &be]() mutable { be.gemm(a, ta, b, tb, out, 0.5, 1.0); },
                             [=] {
                                 return std::vector<OpOutput>{{"c", out, tol}};
                             }};
            };
            cases.push_back(std::move(c));
        }
    return cases;
}

}  // namespace
}  // namespace op_cases_gemm

std::vector<OpRow> gemm_rows() {
    return {{"gemm", op_cases_gemm::gemm_cases}};
}

}  // namespace ptool::testing
