// The op-case table's rows whose results are exact on every backend (op_cases.h): copy (a dtype
// conversion, rounded once), transpose12, embedding and its backward (the same order of sums),
// held at atol 0; draw_init, held bitwise (its promise: the same parameters on every device).
#include <fmt/format.h>

#include "core/rng.h"
#include "op_cases.h"

namespace ptool::testing {

namespace op_cases_exact {
namespace {

const OpTolerance kExact{.atol = 0.0};

std::vector<OpCase> copy_cases(DType dt) {
    return {op_case("[67, 129] to float32", [=](Backend& be) {
        const Tensor x = place(be, uniform_tensor({67, 129}, dt, 4));
        Tensor out = place(be, Tensor({67, 129}, DType::float32));
        return OpRun{[=, &be]() mutable { be.copy(x, out); },
                     [=] {
                         return std::vector<OpOutput>{{"dst", out, kExact}};
                     }};
    })};
}

std::vector<OpCase> transpose12_cases(DType dt) {
    return {op_case("[2, 3, 5, 7]", [=](Backend& be) {
        const Tensor x = place(be, uniform_tensor({2, 3, 5, 7}, dt, 20));
        Tensor y = place(be, Tensor({2, 5, 3, 7}, dt));
        return OpRun{[=, &be]() mutable { be.transpose12(x, y); },
                     [=] {
                         return std::vector<OpOutput>{{"y", y, kExact}};
                     }};
    })};
}

// ids [4, 9] of a vocabulary of 50, one of them -1: a row another rank holds
Tensor token_ids() {
    Tensor tok = id_tensor({4, 9}, 50, 17);
    tok.data<int64_t>()[3] = -1;
    return tok;
}

std::vector<OpCase> embedding_cases(DType dt) {
    return {op_case("w [50, 24] ids [4, 9]", [=](Backend& be) {
        const Tensor w = place(be, uniform_tensor({50, 24}, dt, 16)), ids = place(be, token_ids());
        Tensor y = place(be, Tensor({4, 9, 24}, dt));
        return OpRun{[=, &be]() mutable { be.embedding(ids, w, y); },
                     [=] {
                         return std::vector<OpOutput>{{"y", y, kExact}};
                     }};
    })};
}

std::vector<OpCase> embedding_backward_cases(DType dt) {
    return {op_case("dw [50, 24] ids [4, 9]", [=](Backend& be) {
        const Tensor ids = place(be, token_ids()), dy = place(be, uniform_tensor({4, 9, 24}, dt, 18));
        Tensor dw = place(be, uniform_tensor({50, 24}, dt, 19));
        return OpRun{[=, &be]() mutable { be.embedding_backward(ids, dy, dw); },
                     [=] {
                         return std::vector<OpOutput>{{"dw", dw, kExact}};
                     }};
    })};
}

// A whole tensor and shards along each dim of a 2-D one, uniform and normal (test_cuda_backend's
// "draw_init is bitwise" case draws the same at sizes that fill the GPU's grid).
std::vector<OpCase> draw_init_cases(DType dt) {
    struct Shard {
        Shape local;
        int64_t run, full_len, inner, offset;
    };
    const Shard shards[] = {
        {{1003}, 1003, 1003, 1, 0},    // whole
        {{17, 13}, 13, 31, 1, 11},     // a column shard of [17, 31]
        {{9, 33}, 9 * 33, 27, 33, 9},  // a row shard of [27, 33]
    };
    std::vector<OpCase> cases;
    for (const Shard& sh : shards)
        for (const bool normal : {false, true}) {
            InitDraw d;
            d.seed = 20261128, d.stream = stream_id("init", "layers.0.weight"), d.normal = normal;
            d.scale = normal ? 0.02 : 0.03125, d.run = sh.run, d.full_len = sh.full_len, d.inner = sh.inner,
            d.offset = sh.offset;
            const std::string label = fmt::format("{} of {} at {}, {}", shape_str(sh.local), sh.full_len,
                                                  sh.offset, normal ? "normal" : "uniform");
            cases.push_back(op_case(label, [=](Backend& be) {
                Tensor t = Tensor::empty(sh.local, dt, be.device());
                return OpRun{[=, &be]() mutable { be.draw_init(t, d); },
                             [=] {
                                 return std::vector<OpOutput>{
                                     {"t", t, {.kind = OpTolerance::Kind::bitwise, .atol = 0.0}}};
                             }};
            }));
        }
    return cases;
}

}  // namespace
}  // namespace op_cases_exact

std::vector<OpRow> exact_rows() {
    using namespace op_cases_exact;
    return {
        {"copy", copy_cases},
        {"transpose12", transpose12_cases},
        {"embedding", embedding_cases},
        {"embedding_backward", embedding_backward_cases},
        {"draw_init", draw_init_cases,
         "a meta tensor keeps no values, so the meta backend draws none (model/init.cpp), and "
         "initialisation is no part of the step the planner prices"},
    };
}

}  // namespace ptool::testing
