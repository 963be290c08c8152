// The op-case table's norm rows (op_cases.h): layer_norm and rms_norm forward and backward over a
// row longer than a GPU block's 1024 threads (so the threads loop within a row), and batch norm's
// four pieces on [64, 33]. A backward op's statistics come from the CPU's forward: every backend
// differentiates at the same point.
#include <cmath>

#include "op_cases.h"

namespace ptool::testing {

namespace op_cases_norm {
namespace {

constexpr int64_t kRows = 37, kDim = 1500;  // layer norm's
constexpr int64_t kN = 64, kC = 33;         // batch norm's

DType stats_dtype(DType dt) {
    return dt == DType::float64 ? DType::float64 : DType::float32;
}

const char* norm_name(bool rms) {
    return rms ? "rms [37, 1500]" : "layer [37, 1500]";
}

std::vector<OpCase> layer_norm_cases(DType dt) {
    std::vector<OpCase> cases;
    for (const bool rms : {false, true})
        cases.push_back(op_case(norm_name(rms), [=](Backend& be) {
            const Tensor x = place(be, uniform_tensor({kRows, kDim}, dt, 8)),
                         w = place(be, uniform_tensor({kDim}, dt, 9)),
                         b = place(be, uniform_tensor({kDim}, dt, 10));
            Tensor y = place(be, Tensor({kRows, kDim}, dt)),
                   mean = place(be, Tensor({kRows}, stats_dtype(dt))),
                   rstd = place(be, Tensor({kRows}, stats_dtype(dt)));
            return OpRun{
                [=, &be]() mutable { be.layer_norm(x, w, b, 1e-5, rms, y, mean, rstd); },
                [=] {
                    return std::vector<OpOutput>{{"y", y, {}}, {"mean", mean, {}}, {"rstd", rstd, {}}};
                }};
        }));
    return cases;
}

std::vector<OpCase> layer_norm_backward_cases(DType dt) {
    std::vector<OpCase> cases;
    for (const bool rms : {false, true})
        cases.push_back(op_case(norm_name(rms), [=](Backend& be) {
            const Tensor hx = uniform_tensor({kRows, kDim}, dt, 8), hw = uniform_tensor({kDim}, dt, 9),
                         hb = uniform_tensor({kDim}, dt, 10);
            Tensor hy({kRows, kDim}, dt), hmean({kRows}, stats_dtype(dt)), hrstd({kRows}, stats_dtype(dt));
            host_backend().layer_norm(hx, hw, hb, 1e-5, rms, hy, hmean, hrstd);
            const Tensor x = place(be, hx), w = place(be, hw), mean = place(be, hmean),
                         rstd = place(be, hrstd), dy = place(be, uniform_tensor({kRows, kDim}, dt, 11));
            Tensor dx = place(be, Tensor({kRows, kDim}, dt)), dw = place(be, Tensor({kDim}, dt)),
                   db = place(be, Tensor({kDim}, dt));
            return OpRun{
                [=, &be]() mutable { be.layer_norm_backward(x, w, mean, rstd, dy, rms, dx, &dw, &db); },
                [=] {
                    return std::vector<OpOutput>{
                        {"dx", dx, {}}, {"dw", dw, {.atol = 1e-4}}, {"db", db, {.atol = 1e-4}}};
                }};
        }));
    return cases;
}

// Batch norm's inputs on the host: x, its moments and rstd (eps 1e-5), w, b, dy and the sums of dy.
struct BatchNormInputs {
    Tensor x, mean, var, rstd, w, b, dy, sum_dy, sum_dy_xhat;
};

BatchNormInputs batch_norm_inputs(DType dt) {
    const DType sd = stats_dtype(dt);
    BatchNormInputs in{uniform_tensor({kN, kC}, dt, 12),
                       Tensor({kC}, sd),
                       Tensor({kC}, sd),
                       Tensor({kC}, sd),
                       uniform_tensor({kC}, dt, 13),
                       uniform_tensor({kC}, dt, 14),
                       uniform_tensor({kN, kC}, dt, 15),
                       Tensor({kC}, sd),
                       Tensor({kC}, sd)};
    Backend& host = host_backend();
    host.channel_moments(in.x, in.mean, in.var);
    for (int64_t j = 0; j < kC; ++j) in.rstd.set(j, 1.0 / std::sqrt(in.var.item(j) + 1e-5));
    host.batch_norm_grad_sums(in.x, in.mean, in.rstd, in.dy, in.sum_dy, in.sum_dy_xhat);
    return in;
}

// Summed in double in the same order on every backend: atol 0
std::vector<OpCase> channel_moments_cases(DType dt) {
    return {op_case("[64, 33]", [=](Backend& be) {
        const Tensor x = place(be, uniform_tensor({kN, kC}, dt, 12));
        Tensor mean = place(be, Tensor({kC}, stats_dtype(dt))),
               var = place(be, Tensor({kC}, stats_dtype(dt)));
        return OpRun{
            [=, &be]() mutable { be.channel_moments(x, mean, var); },
            [=] {
                return std::vector<OpOutput>{{"mean", mean, {.atol = 0.0}}, {"var", var, {.atol = 0.0}}};
            }};
    })};
}

std::vector<OpCase> batch_norm_apply_cases(DType dt) {
    return {op_case("[64, 33]", [=](Backend& be) {
        const BatchNormInputs in = batch_norm_inputs(dt);
        const Tensor x = place(be, in.x), mean = place(be, in.mean), rstd = place(be, in.rstd),
                     w = place(be, in.w), b = place(be, in.b);
        Tensor y = place(be, Tensor({kN, kC}, dt));
        return OpRun{[=, &be]() mutable { be.batch_norm_apply(x, mean, rstd, w, b, y); },
                     [=] {
                         return std::vector<OpOutput>{{"y", y, {}}};
                     }};
    })};
}

std::vector<OpCase> batch_norm_grad_sums_cases(DType dt) {
    return {op_case("[64, 33]", [=](Backend& be) {
        const BatchNormInputs in = batch_norm_inputs(dt);
        const Tensor x = place(be, in.x), mean = place(be, in.mean), rstd = place(be, in.rstd),
                     dy = place(be, in.dy);
        Tensor s1 = place(be, Tensor({kC}, stats_dtype(dt))), s2 = place(be, Tensor({kC}, stats_dtype(dt)));
        return OpRun{[=, &be]() mutable { be.batch_norm_grad_sums(x, mean, rstd, dy, s1, s2); },
                     [=] {
                         return std::vector<OpOutput>{{"sum_dy", s1, {.atol = 1e-9}},
                                                      {"sum_dy_xhat", s2, {.atol = 1e-9}}};
                     }};
    })};
}

std::vector<OpCase> batch_norm_backward_input_cases(DType dt) {
    return {op_case("[64, 33]", [=](Backend& be) {
        const BatchNormInputs in = batch_norm_inputs(dt);
        const Tensor x = place(be, in.x), mean = place(be, in.mean), rstd = place(be, in.rstd),
                     w = place(be, in.w), dy = place(be, in.dy), s1 = place(be, in.sum_dy),
                     s2 = place(be, in.sum_dy_xhat);
        Tensor dx = place(be, Tensor({kN, kC}, dt));
        return OpRun{
            [=, &be]() mutable { be.batch_norm_backward_input(x, mean, rstd, w, dy, s1, s2, kN, dx); },
            [=] {
                return std::vector<OpOutput>{{"dx", dx, {}}};
            }};
    })};
}

}  // namespace
}  // namespace op_cases_norm

std::vector<OpRow> norm_rows() {
    using namespace op_cases_norm;
    return {
        {"layer_norm", layer_norm_cases},
        {"layer_norm_backward", layer_norm_backward_cases},
        {"channel_moments", channel_moments_cases},
        {"batch_norm_apply", batch_norm_apply_cases},
        {"batch_norm_grad_sums", batch_norm_grad_sums_cases},
        {"batch_norm_backward_input", batch_norm_backward_input_cases},
    };
}

}  // namespace ptool::testing
