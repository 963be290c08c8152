// The op-case table's fused attention rows (op_cases.h): attention_forward and attention_backward
// where a backend has the kernels (Backend::fused_attention: CUDA), and elsewhere their contract
// computed through the backend's plain ops by attention_oracle.h, as the engine's tile path does
// (the CPU's oracle; on meta what the planner's simulation counts, since the engine never asks
// meta for the fused kernel). Grouped and plain heads, causal and not, o in both layouts, a ring
// block's positions (one query that sees no key: m -inf, l 0, o and its gradients 0), head dims
// that fill 2, 4 and 8 dims a lane and leave lanes idle, sequences over several row and column
// blocks with short last ones. The oracle rounds the scores and probabilities to the dtype as the
// tile path's gemm and softmax do; the kernels keep them in float: bfloat16 compares at a few of
// its ulps, and l by the bound its rounded scores imply.
#include <fmt/format.h>

#include <cmath>

#include "attention_oracle.h"
#include "op_cases.h"

namespace ptool::testing {

namespace op_cases_attention {
namespace {

struct Shape6 {
    int64_t b, heads, kv, t, s, hd;
    bool causal, merged, positions;
};
const Shape6 kCases[] = {
    {2, 4, 2, 200, 200, 64, true, true, false},  // llama-like: grouped, causal, two row tiles
    {1, 3, 3, 37, 37, 80, false, false, false},  // plain heads, not causal, hd 80 (4 a lane, 16 idle)
    {2, 4, 1, 70, 150, 32, true, false, true},   // a ring block: queries and keys by position
    {1, 2, 2, 33, 65, 256, true, true, false},   // hd 256; more keys than queries (offset S - T)
    {1, 1, 1, 5, 7, 6, true, false, false},      // a tiny head: one short block each way
};

std::string label_of(const Shape6& c) {
    return fmt::format("b {} heads {}/{} t {} s {} hd {}{}{}{}", c.b, c.heads, c.kv, c.t, c.s, c.hd,
                       c.causal ? " causal" : "", c.merged ? " o merged" : "",
                       c.positions ? " positions" : "");
}

// The forward on one backend: the fused kernel (o in the case's layout) or the oracle (o split).
struct Forward {
    Shape6 c;
    bool fused = false;
    AttentionArgs args;  // the kernel's (positions and o's layout on the device) or the oracle's
    Tensor q, k, v, o, m, l;
    void run(Backend& be) {
        if (fused)
            be.attention_forward(args, q, k, v, o, m, l);
        else
            oracle_forward(be, args, q, k, v, o, m, l);
    }
    Tensor o_split(Backend& be) const { return fused && c.merged ? split_layout(be, o, c.b, c.heads) : o; }
};

Forward forward_on(Backend& be, const Shape6& c, DType dt) {
    Forward f;
    f.c = c, f.fused = be.fused_attention(dt, c.hd);
    AttentionArgs& a = f.args;
    a.batch = c.b, a.heads = c.heads, a.kv_heads = c.kv, a.causal = c.causal;
    a.scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
    if (c.positions) {  // queries at 3i + 40 (the first before every key), keys at 2j + 41
        Tensor qp({c.t}, DType::int64), kp({c.s}, DType::int64);
        for (int64_t i = 0; i < c.t; ++i) qp.data<int64_t>()[i] = 3 * i + 40;
        for (int64_t j = 0; j < c.s; ++j) kp.data<int64_t>()[j] = 2 * j + 41;
        // the oracle reads them on the host; the kernel on its device
        a.query_pos = f.fused ? place(be, qp) : qp, a.key_pos = f.fused ? place(be, kp) : kp;
    }
    a.o_merged = f.fused && c.merged;
    const int64_t n = c.b * c.heads;
    f.q = place(be, uniform_tensor({n, c.t, c.hd}, dt, 40));
    f.k = place(be, uniform_tensor({c.b * c.kv, c.s, c.hd}, dt, 41));
    f.v = place(be, uniform_tensor({c.b * c.kv, c.s, c.hd}, dt, 42));
    f.o = place(be, a.o_merged ? Tensor({c.b, c.t, c.heads * c.hd}, dt) : Tensor({n, c.t, c.hd}, dt));
    f.m = place(be, Tensor({n, c.t}, acc_dtype(dt)));
    f.l = place(be, Tensor({n, c.t}, acc_dtype(dt)));
    return f;
}

OpCase attention_case(const Shape6& c, DType dt, std::function<OpRun(Backend&)> setup) {
    OpCase oc = op_case(label_of(c), std::move(setup));
    const int64_t hd = c.hd;
    oc.compared_on = [dt, hd](const Backend& be) { return be.fused_attention(dt, hd); };
    return oc;
}

std::vector<OpCase> forward_cases(DType dt) {
    const double atol = dt == DType::bfloat16 ? 5e-2 : 1e-5, gtol = dt == DType::bfloat16 ? 1e-1 : 1e-4;
    std::vector<OpCase> cases;
    for (const Shape6& c : kCases)
        cases.push_back(attention_case(c, dt, [=](Backend& be) {
            auto f = std::make_shared<Forward>(forward_on(be, c, dt));
            return OpRun{
                [f, &be] { f->run(be); },
                [f, &be, atol, gtol, dt] {
                    OpTolerance l_tol{.atol = gtol};
                    if (dt == DType::bfloat16)
                        l_tol = {.kind = OpTolerance::Kind::row_sums, .row_max = f->m, .keys = f->c.s};
                    return std::vector<OpOutput>{{"o", f->o_split(be), {.atol = atol}},
                                                 {"m", f->m, {.atol = atol, .finite = !f->c.positions}},
                                                 {"l", f->l, l_tol}};
                }};
        }));
    return cases;
}

// The backward from its own backend's forward (run in the setup): a kernel's m and l are the
// statistics of its float scores, which its backward's probabilities are normalised by; the
// tolerances were measured on that pair. dq accumulates into a drawn start.
std::vector<OpCase> backward_cases(DType dt) {
    const double gtol = dt == DType::bfloat16 ? 1e-1 : 1e-4;
    std::vector<OpCase> cases;
    for (const Shape6& c : kCases)
        cases.push_back(attention_case(c, dt, [=](Backend& be) {
            auto f = std::make_shared<Forward>(forward_on(be, c, dt));
            f->run(be);
            const int64_t n = c.b * c.heads;
            const Tensor hd_o = uniform_tensor({n, c.t, c.hd}, dt, 43);
            const Tensor d_o =
                place(be, f->args.o_merged ? merged_layout(host_backend(), hd_o, c.b, c.heads) : hd_o);
            Tensor dq = place(be, uniform_tensor({n, c.t, c.hd}, dt, 44)),
                   dk = place(be, Tensor({c.b * c.kv, c.s, c.hd}, dt)),
                   dv = place(be, Tensor(dk.shape(), dt));
            return OpRun{[=, &be]() mutable {
                             if (f->fused)
                                 be.attention_backward(f->args, f->q, f->k, f->v, f->o, d_o, f->m, f->l, dq,
                                                       dk, dv, true);
                             else
                                 oracle_backward(be, f->args, f->q, f->k, f->v, f->o, d_o, f->m, f->l, dq, dk,
                                                 dv, true);
                         },
                         [=] {
                             return std::vector<OpOutput>{{"dq", dq, {.atol = gtol}},
                                                          {"dk", dk, {.atol = gtol}},
                                                          {"dv", dv, {.atol = gtol}}};
                         }};
        }));
    return cases;
}

}  // namespace
}  // namespace op_cases_attention

std::vector<OpRow> attention_rows() {
    using namespace op_cases_attention;
    return {
        {"attention_forward", forward_cases},
        {"attention_backward", backward_cases},
    };
}

}  // namespace ptool::testing
