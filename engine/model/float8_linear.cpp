#include "model/float8_linear.h"

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "backend/meta/meta_backend.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "model/context_shard.h"
#include "model/float8_cost.h"
#include "model/float8_gemm.h"
#include "model/module.h"

namespace ptool {
namespace {

// The ranks holding pieces of an activation-shaped tensor (a linear's input or its output's
// gradient): tp where its placement shards it, cp where each rank holds some positions.
std::vector<Communicator*> activation_shards(const RunContext& ctx, bool tp_sharded) {
    std::vector<Communicator*> out;
    if (tp_sharded && ctx.tp && ctx.tp->size() > 1) out.push_back(ctx.tp);
    if (ctx.context && ctx.context->parts > 1 && ctx.context->comm) out.push_back(ctx.context->comm);
    return out;
}

// The amax of each of `groups` equal blocks of t's rows, reduced (max) over `over`.
std::vector<double> amax_of(const Tensor& t, int groups, const std::vector<Communicator*>& over,
                            bool reduce) {
    const int64_t rows = t.size(0);
    PTOOL_REQUIRE(groups >= 1 && rows % groups == 0,
                  "float8: {} rows do not split into the {} data ranks' rows", rows, groups);
    std::vector<Tensor> blocks;
    for (int g = 0; g < groups; ++g) blocks.push_back(t.narrow(0, g * (rows / groups), rows / groups));
    return float8_amax_over(blocks, over, reduce);
}

// On meta tensors the emulation's GEMMs (on float32 values) are counted as what they stand for:
// float8 GEMMs writing the compute dtype (the kernel table's float8 rows price them).
class PricedAs {
public:
    explicit PricedAs(const Tensor& operand) {
        if (operand.device() == Device::meta)
            scope_.emplace(MetaKernelMode{.gemm_dtype = operand.dtype(), .gemm_float8 = true});
    }

private:
    std::optional<MetaKernelScope> scope_;
};

int row_groups(const RunContext& ctx) {
    return std::max(1, ctx.float8_row_groups);
}

std::vector<double> activation_amax(const RunContext& ctx, const Float8Gemms& f, const Tensor& t2,
                                    bool tp_cut) {
    return amax_of(t2, row_groups(ctx), activation_shards(ctx, tp_cut), f.recipe.reduce_amax);
}

double weight_amax(const RunContext& ctx, const Float8Gemms& f, const Parameter& w) {
    if (w.float8_scale > 0) return 0;  // gathered in float8: its scale came with it
    std::vector<Communicator*> over;
    if (f.tp.weight && ctx.tp && ctx.tp->size() > 1) over.push_back(ctx.tp);
    return amax_of(w.value.reshape({1, w.value.numel()}), 1, over, f.recipe.reduce_amax)[0];
}

Float8Operand weight_operand(const Float8Gemms& f, const Parameter& w, double amax) {
    if (w.float8_scale > 0) return float8_from_codes(w.value, f.recipe.weight, w.float8_scale);
    return float8_tensorwise(w.value, f.recipe.weight, amax);
}

// out's row blocks = op(a's row block) op(b) in float8, a's blocks each scaled by its own amax.
void by_row_groups(RunContext& ctx, const Tensor& a2, Float8Format fa, const std::vector<double>& a_amax,
                   const Float8Operand& b, bool trans_b, Tensor& out) {
    const int64_t groups = static_cast<int64_t>(a_amax.size()), rows = a2.size(0) / groups;
    for (int64_t g = 0; g < groups; ++g) {
        const Float8Operand a = float8_tensorwise(a2.narrow(0, g * rows, rows), fa, a_amax[g]);
        Tensor block = out.narrow(0, g * rows, rows);
        float8_gemm(*ctx.backend, a, false, b, trans_b, block);
    }
}

}  // namespace

std::vector<double> float8_amax_over(const std::vector<Tensor>& pieces,
                                     const std::vector<Communicator*>& over, bool reduce) {
    const int64_t n = static_cast<int64_t>(pieces.size());
    if (n == 0) return {};
    // each piece's amax and, beside it, whether it holds a NaN (1): a max keeps the flag wherever
    // it came from, where a max over NaN itself would keep it or not by the ranks' order
    Tensor a(Shape{2 * n}, DType::float32, pieces[0].device());
    for (int64_t g = 0; g < n; ++g) {
        const double amax = float8_amax(pieces[g]);
        a.set(g, std::isnan(amax) ? 0.0 : amax), a.set(n + g, std::isnan(amax) ? 1.0 : 0.0);
    }
    if (reduce)
        for (Communicator* c : over) c->all_reduce(a, ReduceOp::max);
    if (a.device() == Device::meta) return std::vector<double>(n, 0.0);
    const std::vector<double> v = a.to_doubles();
    std::vector<double> out(n);
    for (int64_t g = 0; g < n; ++g) out[g] = v[n + g] > 0 ? std::numeric_limits<double>::quiet_NaN() : v[g];
    return out;
}

void float8_forward(RunContext& ctx, const Float8Gemms& f, const Tensor& x2, const Parameter& w, Tensor& y2) {
    const std::vector<double> ax = activation_amax(ctx, f, x2, f.tp.input);
    const double aw = weight_amax(ctx, f, w);
    const PricedAs priced(x2);
    by_row_groups(ctx, x2, f.recipe.input, ax, weight_operand(f, w, aw), true, y2);
}

Float8BackwardAmax float8_backward_amax(RunContext& ctx, const Float8Gemms& f, const Tensor& dy2,
                                        const Tensor& x2, const Parameter& w) {
    Float8BackwardAmax a;
    a.grad_output = activation_amax(ctx, f, dy2, f.tp.grad_output);
    a.input = activation_amax(ctx, f, x2, f.tp.input);
    a.weight = weight_amax(ctx, f, w);
    return a;
}

void float8_input_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                       const Parameter& w, Tensor& dx2) {
    const PricedAs priced(dy2);
    by_row_groups(ctx, dy2, f.recipe.grad_output, a.grad_output, weight_operand(f, w, a.weight), false, dx2);
}

void float8_weight_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                        const Tensor& x2, Tensor& dw) {
    const PricedAs priced(dy2);
    const int64_t groups = static_cast<int64_t>(a.grad_output.size()), rows = dy2.size(0) / groups;
    for (int64_t g = 0; g < groups; ++g) {  // each data rank's own GEMM, added to the gradient in rank order
        const Float8Operand d =
            float8_tensorwise(dy2.narrow(0, g * rows, rows), f.recipe.grad_output, a.grad_output[g]);
        const Float8Operand x = float8_tensorwise(x2.narrow(0, g * rows, rows), f.recipe.input, a.input[g]);
        Tensor part = Tensor::empty(dw.shape(), dw.dtype(), dw.device());
        float8_gemm(*ctx.backend, d, true, x, false, part);
        const Float8EmulationOnly handed_over;  // torchao's GEMM writes the gradient itself
        ctx.backend->axpy(1.0, part, dw);
    }
}

}  // namespace ptool
