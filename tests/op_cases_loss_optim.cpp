// The op-case table's losses and optimizer steps (op_cases.h). The losses divide by the call's own
// valid items (12 of 13 rows: reduction='mean') and by a step's count over every rank (40:
// global_tokens); the loss they return is held to rtol_of alone. The optimizers' case is their
// second step (the first, in the setup, on the same backend, fills the momentum buffers as a run
// would), momentum and weight decay on.
#include <fmt/format.h>

#include <memory>

#include "op_cases.h"

namespace ptool::testing {

namespace op_cases_loss_optim {
namespace {

const Shape kParam{67, 129};

OpOutput returned(const char* name, double value, DType dt) {
    return {name, Tensor::scalar(value, DType::float64), {.atol = 0.0, .rtol = rtol_of(dt)}};
}

std::vector<OpCase> cross_entropy_cases(DType dt) {
    std::vector<OpCase> cases;
    for (const double divisor : {12.0, 40.0})
        cases.push_back(op_case(fmt::format("[13, 2000], one row ignored, / {}", divisor), [=](Backend& be) {
            Tensor target = id_tensor({13}, 2000, 24);
            target.data<int64_t>()[2] = -100;  // ignore_index
            const Tensor logits = place(be, uniform_tensor({13, 2000}, dt, 23)), t = place(be, target);
            Tensor dl = place(be, Tensor({13, 2000}, dt));
            auto loss = std::make_shared<double>(0.0);
            return OpRun{[=, &be]() mutable { *loss = be.cross_entropy(logits, t, -100, divisor, dl); },
                         [=] {
                             return std::vector<OpOutput>{returned("loss", *loss, dt), {"dlogits", dl, {}}};
                         }};
        }));
    // every row ignored and nothing to divide by (a call with no valid target under mean_per_call):
    // the loss is 0 / 0 = NaN and not compared; the gradients are PyTorch's zeros, not 0 / 0
    cases.push_back(op_case("[5, 300], every row ignored, / 0", [=](Backend& be) {
        Tensor target = id_tensor({5}, 300, 27);
        for (int64_t i = 0; i < 5; ++i) target.data<int64_t>()[i] = -100;
        const Tensor logits = place(be, uniform_tensor({5, 300}, dt, 28)), t = place(be, target);
        Tensor dl = place(be, Tensor::full({5, 300}, dt, 1.0));
        return OpRun{[=, &be]() mutable { be.cross_entropy(logits, t, -100, 0.0, dl); },
                     [=] {
                         return std::vector<OpOutput>{{"dlogits", dl, {}}};
                     }};
    }));
    return cases;
}

std::vector<OpCase> mse_cases(DType dt) {
    std::vector<OpCase> cases;
    for (const double divisor : {12.0, 40.0})
        cases.push_back(op_case(fmt::format("[31, 17] / {}", divisor), [=](Backend& be) {
            const Tensor out = place(be, uniform_tensor({31, 17}, dt, 25)),
                         target = place(be, uniform_tensor({31, 17}, dt, 26));
            Tensor dout = place(be, Tensor({31, 17}, dt));
            auto loss = std::make_shared<double>(0.0);
            return OpRun{[=, &be]() mutable { *loss = be.mse(out, target, divisor, dout); },
                         [=] {
                             return std::vector<OpOutput>{returned("loss", *loss, dt), {"dout", dout, {}}};
                         }};
        }));
    return cases;
}

std::vector<OpCase> sgd_step_cases(DType dt) {
    return {op_case("[67, 129] step 2, lr 0.1 momentum 0.9 wd 0.01", [=](Backend& be) {
        Tensor p = place(be, uniform_tensor(kParam, dt, 4)), buf = place(be, Tensor(kParam, dt));
        const Tensor g = place(be, uniform_tensor(kParam, dt, 5));
        be.sgd_step(p, g, buf, 0.1, 0.9, 0.01, true);
        return OpRun{[=, &be]() mutable { be.sgd_step(p, g, buf, 0.1, 0.9, 0.01, false); },
                     [=] {
                         return std::vector<OpOutput>{{"p", p, {}}, {"momentum_buf", buf, {}}};
                     }};
    })};
}

std::vector<OpCase> adamw_step_cases(DType dt) {
    return {op_case("[67, 129] step 2, lr 1e-3 wd 0.01", [=](Backend& be) {
        Tensor p = place(be, uniform_tensor(kParam, dt, 4)), m = place(be, Tensor(kParam, dt)),
               v = place(be, Tensor(kParam, dt));
        const Tensor g = place(be, uniform_tensor(kParam, dt, 5));
        be.adamw_step(p, g, m, v, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01);
        return OpRun{
            [=, &be]() mutable { be.adamw_step(p, g, m, v, 2, 1e-3, 0.9, 0.999, 1e-8, 0.01); },
            [=] {
                return std::vector<OpOutput>{{"p", p, {}}, {"exp_avg", m, {}}, {"exp_avg_sq", v, {}}};
            }};
    })};
}

}  // namespace
}  // namespace op_cases_loss_optim

std::vector<OpRow> loss_optimizer_rows() {
    using namespace op_cases_loss_optim;
    return {
        {"cross_entropy", cross_entropy_cases},
        {"mse", mse_cases},
        {"sgd_step", sgd_step_cases},
        {"adamw_step", adamw_step_cases},
    };
}

}  // namespace ptool::testing
