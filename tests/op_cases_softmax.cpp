// The op-case table's softmax rows (op_cases.h): the row softmax, causal and not, and its
// backward on [2, 3, 6, 9]; the ring's blocked softmax (softmax_stats, softmax_merge,
// softmax_from_stats, softmax_backward_rows) on 6 rows of 9 keys, one row all -inf (the statistics
// of a fully masked block: m -inf, l 0). Each op's inputs that another op makes come from the CPU's
// run of that op, so every backend gets the same ones.
#include <cmath>

#include "op_cases.h"

namespace ptool::testing {

namespace op_cases_softmax {
namespace {

const Shape kScores{2, 3, 6, 9};

std::vector<OpCase> softmax_cases(DType dt) {
    std::vector<OpCase> cases;
    for (const bool causal : {false, true})
        cases.push_back(op_case(causal ? "[2, 3, 6, 9] causal" : "[2, 3, 6, 9]", [=](Backend& be) {
            const Tensor x = place(be, uniform_tensor(kScores, dt, 21));
            Tensor y = place(be, Tensor(kScores, dt));
            return OpRun{[=, &be]() mutable { be.softmax(x, causal, y); },
                         [=] {
                             return std::vector<OpOutput>{{"y", y, {}}};
                         }};
        }));
    return cases;
}

std::vector<OpCase> softmax_backward_cases(DType dt) {
    std::vector<OpCase> cases;
    for (const bool causal : {false, true})
        cases.push_back(op_case(causal ? "[2, 3, 6, 9] causal" : "[2, 3, 6, 9]", [=](Backend& be) {
            Tensor hy(kScores, dt);
            host_backend().softmax(uniform_tensor(kScores, dt, 21), causal, hy);
            const Tensor y = place(be, hy), dy = place(be, uniform_tensor(kScores, dt, 22));
            Tensor dx = place(be, Tensor(kScores, dt));
            return OpRun{[=, &be]() mutable { be.softmax_backward(y, dy, dx); },
                         [=] {
                             return std::vector<OpOutput>{{"dx", dx, {}}};
                         }};
        }));
    return cases;
}

// The blocked softmax's values on the host, each from the one before: the block's scores s (row 2
// all -inf), its probabilities p and statistics (m, l); a running row (o, m2, l2) merged with the
// block's output ob; the probabilities q under the merged statistics.
struct Block {
    Tensor s, p, m, l, o, m2, l2, ob, q;
};

Block block_inputs(DType dt, int stage) {
    const DType st = acc_dtype(dt);
    Block b;
    b.s = uniform_tensor({6, 9}, dt, 27);
    for (int64_t j = 0; j < 9; ++j) b.s.set(2 * 9 + j, -INFINITY);
    b.p = Tensor({6, 9}, dt), b.m = Tensor({6}, st), b.l = Tensor({6}, st);
    b.o = uniform_tensor({6, 4}, dt, 29), b.ob = uniform_tensor({6, 4}, dt, 30);
    b.m2 = uniform_tensor({6}, st, 31), b.l2 = uniform_tensor({6}, st, 32, 0.5, 2.0),
    b.q = Tensor({6, 9}, dt);
    Backend& host = host_backend();
    if (stage >= 1) host.softmax_stats(b.s, b.p, b.m, b.l);
    if (stage >= 2) host.softmax_merge(b.o, b.m2, b.l2, b.ob, b.m, b.l);
    if (stage >= 3) host.softmax_from_stats(b.s, b.m2, b.l2, b.q);
    return b;
}

std::vector<OpCase> softmax_stats_cases(DType dt) {
    return {op_case("[6, 9], a row all -inf", [=](Backend& be) {
        const Block in = block_inputs(dt, 0);
        const Tensor x = place(be, in.s);
        Tensor y = place(be, in.p), m = place(be, in.m), l = place(be, in.l);
        return OpRun{
            [=, &be]() mutable { be.softmax_stats(x, y, m, l); },
            [=] {
                return std::vector<OpOutput>{{"y", y, {}}, {"m", m, {.finite = false}}, {"l", l, {}}};
            }};
    })};
}

std::vector<OpCase> softmax_merge_cases(DType dt) {
    return {op_case("o [6, 4] with a block that has a row all -inf", [=](Backend& be) {
        const Block in = block_inputs(dt, 1);
        const Tensor ob = place(be, in.ob), mb = place(be, in.m), lb = place(be, in.l);
        Tensor o = place(be, in.o), m = place(be, in.m2), l = place(be, in.l2);
        return OpRun{[=, &be]() mutable { be.softmax_merge(o, m, l, ob, mb, lb); },
                     [=] {
                         return std::vector<OpOutput>{{"o", o, {}}, {"m", m, {}}, {"l", l, {}}};
                     }};
    })};
}

std::vector<OpCase> softmax_from_stats_cases(DType dt) {
    return {op_case("[6, 9], a row all -inf", [=](Backend& be) {
        const Block in = block_inputs(dt, 2);
        const Tensor x = place(be, in.s), m = place(be, in.m2), l = place(be, in.l2);
        Tensor y = place(be, in.q);
        return OpRun{[=, &be]() mutable { be.softmax_from_stats(x, m, l, y); },
                     [=] {
                         return std::vector<OpOutput>{{"y", y, {}}};
                     }};
    })};
}

std::vector<OpCase> softmax_backward_rows_cases(DType dt) {
    return {op_case("[6, 9], o [6, 4]", [=](Backend& be) {
        const Block in = block_inputs(dt, 3);
        const Tensor y = place(be, in.q), dy = place(be, uniform_tensor({6, 9}, dt, 33)), o = place(be, in.o),
                     d_o = place(be, uniform_tensor({6, 4}, dt, 34));
        Tensor dx = place(be, Tensor({6, 9}, dt));
        return OpRun{[=, &be]() mutable { be.softmax_backward_rows(y, dy, o, d_o, dx); },
                     [=] {
                         return std::vector<OpOutput>{{"dx", dx, {}}};
                     }};
    })};
}

}  // namespace
}  // namespace op_cases_softmax

std::vector<OpRow> softmax_rows() {
    using namespace op_cases_softmax;
    return {
        {"softmax", softmax_cases},
        {"softmax_backward", softmax_backward_cases},
        {"softmax_stats", softmax_stats_cases},
        {"softmax_merge", softmax_merge_cases},
        {"softmax_from_stats", softmax_from_stats_cases},
        {"softmax_backward_rows", softmax_backward_rows_cases},
    };
}

}  // namespace ptool::testing
