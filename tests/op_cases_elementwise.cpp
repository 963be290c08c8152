// The op-case table's elementwise rows (op_cases.h): activations and their backward, the gated
// (SwiGLU) pair, add, mul, axpy, scale, fill, add_bias and the reductions sum_rows and sum_all, on
// [67, 129] (odd sizes: no vector width or block divides them).
#include <fmt/format.h>

#include <memory>

#include "op_cases.h"

namespace ptool::testing {

namespace op_cases_elementwise {
namespace {

const Shape kShape{67, 129};

const char* act_name(Activation a) {
    static const char* names[] = {"relu", "gelu", "gelu_tanh", "silu", "tanh"};
    return names[static_cast<int>(a)];
}
constexpr Activation kActs[] = {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu,
                                Activation::tanh};
constexpr Activation kGatedActs[] = {Activation::silu, Activation::gelu, Activation::gelu_tanh};

std::vector<OpCase> activation_cases(DType dt) {
    std::vector<OpCase> cases;
    for (Activation act : kActs)
        cases.push_back(op_case(act_name(act), [=](Backend& be) {
            const Tensor x = place(be, uniform_tensor(kShape, dt, 4));
            Tensor y = place(be, Tensor(kShape, dt));
            return OpRun{[=, &be]() mutable { be.activation(act, x, y); },
                         [=] {
                             return std::vector<OpOutput>{{"y", y, {}}};
                         }};
        }));
    return cases;
}

std::vector<OpCase> activation_backward_cases(DType dt) {
    std::vector<OpCase> cases;
    for (Activation act : kActs)
        cases.push_back(op_case(act_name(act), [=](Backend& be) {
            const Tensor x = place(be, uniform_tensor(kShape, dt, 4)),
                         dy = place(be, uniform_tensor(kShape, dt, 5));
            Tensor dx = place(be, Tensor(kShape, dt));
            return OpRun{[=, &be]() mutable { be.activation_backward(act, x, dy, dx); },
                         [=] {
                             return std::vector<OpOutput>{{"dx", dx, {}}};
                         }};
        }));
    return cases;
}

std::vector<OpCase> gated_activation_cases(DType dt) {
    std::vector<OpCase> cases;
    for (Activation act : kGatedActs)
        cases.push_back(op_case(act_name(act), [=](Backend& be) {
            const Tensor g = place(be, uniform_tensor(kShape, dt, 60)),
                         u = place(be, uniform_tensor(kShape, dt, 61));
            Tensor a = place(be, Tensor(kShape, dt)), h = place(be, Tensor(kShape, dt));
            return OpRun{[=, &be]() mutable { be.gated_activation(act, g, u, a, h); },
                         [=] {
                             return std::vector<OpOutput>{{"a", a, {}}, {"h", h, {}}};
                         }};
        }));
    return cases;
}

// The forward's a from the CPU: every backend differentiates at the same point.
std::vector<OpCase> gated_activation_backward_cases(DType dt) {
    std::vector<OpCase> cases;
    for (Activation act : kGatedActs)
        cases.push_back(op_case(act_name(act), [=](Backend& be) {
            const Tensor hg = uniform_tensor(kShape, dt, 60), hu = uniform_tensor(kShape, dt, 61);
            Tensor ha(kShape, dt), hh(kShape, dt);
            host_backend().gated_activation(act, hg, hu, ha, hh);
            const Tensor g = place(be, hg), u = place(be, hu), a = place(be, ha),
                         dh = place(be, uniform_tensor(kShape, dt, 62));
            Tensor du = place(be, Tensor(kShape, dt)), dg = place(be, Tensor(kShape, dt));
            return OpRun{[=, &be]() mutable { be.gated_activation_backward(act, g, a, u, dh, du, dg); },
                         [=] {
                             return std::vector<OpOutput>{{"du", du, {}}, {"dg", dg, {}}};
                         }};
        }));
    return cases;
}

// add, mul and scale: out = f(x, y)
std::vector<OpCase> binary_cases(DType dt, void (*f)(Backend&, const Tensor&, const Tensor&, Tensor&)) {
    return {op_case(shape_str(kShape), [=](Backend& be) {
        const Tensor x = place(be, uniform_tensor(kShape, dt, 4)),
                     y = place(be, uniform_tensor(kShape, dt, 5));
        Tensor out = place(be, Tensor(kShape, dt));
        return OpRun{[=, &be]() mutable { f(be, x, y, out); },
                     [=] {
                         return std::vector<OpOutput>{{"out", out, {}}};
                     }};
    })};
}

std::vector<OpCase> axpy_cases(DType dt) {
    return {op_case("alpha -0.7", [=](Backend& be) {
        const Tensor x = place(be, uniform_tensor(kShape, dt, 4));
        Tensor y = place(be, uniform_tensor(kShape, dt, 5));
        return OpRun{[=, &be]() mutable { be.axpy(-0.7, x, y); },
                     [=] {
                         return std::vector<OpOutput>{{"y", y, {}}};
                     }};
    })};
}

std::vector<OpCase> fill_cases(DType dt) {
    return {op_case("1.25", [=](Backend& be) {
        Tensor t = place(be, uniform_tensor(kShape, dt, 5));
        return OpRun{[=, &be]() mutable { be.fill(t, 1.25); },
                     [=] {
                         return std::vector<OpOutput>{{"t", t, {}}};
                     }};
    })};
}

std::vector<OpCase> add_bias_cases(DType dt) {
    return {op_case("y [67, 129] bias [129]", [=](Backend& be) {
        const Tensor bias = place(be, uniform_tensor({129}, dt, 6));
        Tensor y = place(be, uniform_tensor(kShape, dt, 5));
        return OpRun{[=, &be]() mutable { be.add_bias(y, bias); },
                     [=] {
                         return std::vector<OpOutput>{{"y", y, {}}};
                     }};
    })};
}

// Summed in double in the same order on every backend: bitwise (atol 0 leaves rtol_of's last ulps)
std::vector<OpCase> sum_rows_cases(DType dt) {
    return {op_case("dy [67, 129] accumulated", [=](Backend& be) {
        const Tensor dy = place(be, uniform_tensor(kShape, dt, 4));
        Tensor db = place(be, uniform_tensor({129}, dt, 7));
        return OpRun{[=, &be]() mutable { be.sum_rows(dy, db, true); },
                     [=] {
                         return std::vector<OpOutput>{{"db", db, {.atol = 0.0}}};
                     }};
    })};
}

std::vector<OpCase> sum_all_cases(DType dt) {
    return {op_case(shape_str(kShape), [=](Backend& be) {
        const Tensor x = place(be, uniform_tensor(kShape, dt, 4));
        auto sum = std::make_shared<double>(0.0);
        return OpRun{[=, &be] { *sum = be.sum_all(x); },
                     [=] {
                         return std::vector<OpOutput>{
                             {"sum", Tensor::scalar(*sum, DType::float64), {.atol = 1e-9, .rtol = 1e-9}}};
                     }};
    })};
}

}  // namespace
}  // namespace op_cases_elementwise

std::vector<OpRow> elementwise_rows() {
    using namespace op_cases_elementwise;
    return {
        {"activation", activation_cases},
        {"activation_backward", activation_backward_cases},
        {"gated_activation", gated_activation_cases},
        {"gated_activation_backward", gated_activation_backward_cases},
        {"add",
         [](DType dt) {
             return binary_cases(
                 dt, [](Backend& be, const Tensor& x, const Tensor& y, Tensor& o) { be.add(x, y, o); });
         }},
        {"mul",
         [](DType dt) {
             return binary_cases(
                 dt, [](Backend& be, const Tensor& x, const Tensor& y, Tensor& o) { be.mul(x, y, o); });
         }},
        {"scale",
         [](DType dt) {
             return binary_cases(
                 dt, [](Backend& be, const Tensor& x, const Tensor&, Tensor& o) { be.scale(x, 0.3, o); });
         }},
        {"axpy", axpy_cases},
        {"fill", fill_cases},
        {"add_bias", add_bias_cases},
        {"sum_rows", sum_rows_cases},
        {"sum_all", sum_all_cases},
    };
}

}  // namespace ptool::testing
