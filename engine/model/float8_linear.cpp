#include "model/float8_linear.h"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "backend/meta/meta_backend.h"
#include "comm/communicator.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "model/context_shard.h"
#include "model/float8_cost.h"
#include "model/float8_gemm.h"
#include "model/module.h"

namespace ptool {
namespace {

// The ranks holding pieces of what one scale covers: tp where its placement cuts it (a DTensor's
// amax reduces over its mesh). Not cp: torchtitan's context_parallel hands the linears plain local
// tensors, so each cp rank scales its own positions (and verify's reference scales them apart:
// row_groups). Not the data ranks either: each scales its own rows.
std::vector<Communicator*> tp_shards(const RunContext& ctx, bool cut) {
    std::vector<Communicator*> out;
    if (cut && ctx.tp && ctx.tp->size() > 1) out.push_back(ctx.tp);
    return out;
}

// Each rank's rows of a [rows, features] activation of sequences of `seq` positions
// (RunContext's float8_row_groups): the data ranks' equal blocks, each cut by cp into its ranks'
// positions of every sequence; on a rank one group of every row.
std::vector<Float8Rows> row_groups(const RunContext& ctx, int64_t rows, int64_t seq) {
    const Float8RowGroups& g = ctx.float8_row_groups;
    PTOOL_REQUIRE(g.data >= 1 && rows % g.data == 0,
                  "float8: {} rows do not split into the {} data ranks' rows", rows, g.data);
    const int64_t block = rows / g.data;
    PTOOL_REQUIRE(
        g.cp == 1 || (seq > 0 && block % seq == 0 && seq % ContextShard::pieces(g.cp, g.load_balance) == 0),
        "float8: {} rows of sequences of {} positions do not split into {} cp ranks' positions", block, seq,
        g.cp);
    std::vector<Float8Rows> out;
    for (int d = 0; d < g.data; ++d)
        for (int r = 0; r < g.cp; ++r) {
            Float8Rows ranges;
            if (g.cp == 1) ranges.push_back({d * block, block});
            for (int64_t first = d * block; g.cp > 1 && first < (d + 1) * block; first += seq)
                for (const Chunk& c : ContextShard::chunks_of(seq, g.cp, r, g.load_balance))
                    ranges.push_back({first + c.offset, c.length});
            out.push_back(std::move(ranges));
        }
    return out;
}

// t2's rows in `ranges`, in order: a view where they are one range, else a copy.
Tensor rows_of(const Tensor& t2, const Float8Rows& ranges) {
    if (ranges.size() == 1) return t2.narrow(0, ranges[0].offset, ranges[0].length);
    int64_t n = 0;
    for (const Chunk& c : ranges) n += c.length;
    Tensor out = Tensor::empty({n, t2.size(1)}, t2.dtype(), t2.device());
    int64_t at = 0;
    for (const Chunk& c : ranges) {
        Tensor dst = out.narrow(0, at, c.length);
        backend_for(t2.device()).copy(t2.narrow(0, c.offset, c.length), dst);
        at += c.length;
    }
    return out;
}

// rows_of's inverse: src's rows into t2's `ranges`.
void put_rows(const Tensor& src, const Float8Rows& ranges, Tensor& t2) {
    int64_t at = 0;
    for (const Chunk& c : ranges) {
        Tensor dst = t2.narrow(0, c.offset, c.length);
        backend_for(t2.device()).copy(src.narrow(0, at, c.length), dst);
        at += c.length;
    }
}

bool rowwise(const Float8Gemms& f) {
    return f.recipe.scaling == Float8Scaling::rowwise;
}

// An operand as the recipe casts it: tensorwise with the amax given, or rowwise with a scale per
// row (axis 0) or per column (axis 1) along the GEMM's reduction dim, each from the amax along
// that dim, reduced over tp where tp cuts it (`cut`: which of t's dims tp cuts).
Float8Operand cast(const RunContext& ctx, const Float8Gemms& f, const Tensor& t, Float8Format format,
                   double amax, int axis, Float8Cut cut) {
    if (!rowwise(f)) return float8_tensorwise(t, format, amax);
    const bool along_cut = axis == 0 ? cut.cols : cut.rows;
    const std::vector<double> amaxes = float8_max_over(float8_amax_axis(t, axis), t.device(),
                                                       tp_shards(ctx, along_cut), f.recipe.reduce_amax);
    return float8_axiswise(t, format, amaxes, axis, f.recipe.power_of_2_scales);
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

// Each group's tensorwise amax (the rowwise recipe takes its own per row or column at the cast).
std::vector<double> activation_amax(const RunContext& ctx, const Float8Gemms& f, const Tensor& t2,
                                    const std::vector<Float8Rows>& groups, bool tp_cut) {
    if (rowwise(f)) return std::vector<double>(groups.size(), 0.0);
    std::vector<Tensor> pieces;
    for (const Float8Rows& g : groups) pieces.push_back(rows_of(t2, g));
    return float8_amax_over(pieces, tp_shards(ctx, tp_cut), f.recipe.reduce_amax);
}

double weight_amax(const RunContext& ctx, const Float8Gemms& f, const Parameter& w) {
    if (w.float8_scale > 0 || rowwise(f)) return 0;  // its scale came with it; rowwise: at the cast
    return float8_amax_over({w.value}, tp_shards(ctx, f.tp.weight.any()), f.recipe.reduce_amax)[0];
}

// The weight as a GEMM operand: as gathered in float8, or cast (rowwise along `axis`: per row of W
// for the forward, per column for the input gradient).
Float8Operand weight_operand(const RunContext& ctx, const Float8Gemms& f, const Parameter& w, double amax,
                             int axis) {
    if (w.float8_scale > 0) return float8_from_codes(w.value, f.recipe.weight, w.float8_scale);
    return cast(ctx, f, w.value, f.recipe.weight, amax, axis, f.tp.weight);
}

// out's rows of each group = op(cast_a(a's rows of the group, the group)) op(b) in float8.
void by_row_groups(RunContext& ctx, const Tensor& a2, const std::vector<Float8Rows>& groups,
                   const std::function<Float8Operand(const Tensor&, size_t)>& cast_a, const Float8Operand& b,
                   bool trans_b, Tensor& out) {
    for (size_t g = 0; g < groups.size(); ++g) {
        const Float8Operand a = cast_a(rows_of(a2, groups[g]), g);
        if (groups[g].size() == 1) {
            Tensor block = out.narrow(0, groups[g][0].offset, groups[g][0].length);
            float8_gemm(*ctx.backend, a, false, b, trans_b, block);
            continue;
        }
        Tensor block = Tensor::empty({a.values.size(0), out.size(1)}, out.dtype(), out.device());
        float8_gemm(*ctx.backend, a, false, b, trans_b, block);
        put_rows(block, groups[g], out);
    }
}

}  // namespace

bool float8_recipe_named(const std::string& name, Float8Recipe* out) {
    if (name == "tensorwise") return *out = Float8Recipe{}, true;
    if (name != "rowwise") return false;
    *out = Float8Recipe{};
    out->scaling = Float8Scaling::rowwise, out->grad_output = Float8Format::e4m3fn;
    out->power_of_2_scales = true;
    return true;
}

const char* float8_recipe_name(const Float8Recipe& r) {
    return float8_scaling_name(r.scaling);
}

const char* float8_scaling_name(Float8Scaling s) {
    return s == Float8Scaling::rowwise ? "rowwise" : "tensorwise";
}

std::vector<double> float8_amax_over(const std::vector<Tensor>& pieces,
                                     const std::vector<Communicator*>& over, bool reduce) {
    if (pieces.empty()) return {};
    std::vector<double> amax;
    for (const Tensor& p : pieces) amax.push_back(float8_amax(p));
    return float8_max_over(amax, pieces[0].device(), over, reduce);
}

std::vector<double> float8_max_over(const std::vector<double>& amax, Device device,
                                    const std::vector<Communicator*>& over, bool reduce) {
    const int64_t n = static_cast<int64_t>(amax.size());
    if (n == 0) return {};
    // each amax and, beside it, whether it is NaN (1): a max keeps the flag wherever it came from,
    // where a max over NaN itself would keep it or not by the ranks' order
    Tensor a(Shape{2 * n}, DType::float32, device);
    for (int64_t g = 0; g < n; ++g)
        a.set(g, std::isnan(amax[g]) ? 0.0 : amax[g]), a.set(n + g, std::isnan(amax[g]) ? 1.0 : 0.0);
    if (reduce)
        for (Communicator* c : over) c->all_reduce(a, ReduceOp::max);
    if (a.device() == Device::meta) return std::vector<double>(n, 0.0);
    const std::vector<double> v = a.to_doubles();
    std::vector<double> out(n);
    for (int64_t g = 0; g < n; ++g) out[g] = v[n + g] > 0 ? std::numeric_limits<double>::quiet_NaN() : v[g];
    return out;
}

void float8_forward(RunContext& ctx, const Float8Gemms& f, const Tensor& x2, const Parameter& w, Tensor& y2,
                    int64_t seq) {
    const std::vector<Float8Rows> groups = row_groups(ctx, x2.size(0), seq);
    const std::vector<double> ax = activation_amax(ctx, f, x2, groups, f.tp.input.any());
    const double aw = weight_amax(ctx, f, w);
    const PricedAs priced(x2);
    by_row_groups(
        ctx, x2, groups,
        [&](const Tensor& t, size_t g) { return cast(ctx, f, t, f.recipe.input, ax[g], 0, f.tp.input); },
        weight_operand(ctx, f, w, aw, 0), true, y2);
}

Float8BackwardAmax float8_backward_amax(RunContext& ctx, const Float8Gemms& f, const Tensor& dy2,
                                        const Tensor& x2, const Parameter& w, int64_t seq) {
    Float8BackwardAmax a;
    a.rows = row_groups(ctx, dy2.size(0), seq);
    a.grad_output = activation_amax(ctx, f, dy2, a.rows, f.tp.grad_output.any());
    a.input = activation_amax(ctx, f, x2, a.rows, f.tp.input.any());
    a.weight = weight_amax(ctx, f, w);
    return a;
}

void float8_input_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                       const Parameter& w, Tensor& dx2) {
    const PricedAs priced(dy2);
    by_row_groups(
        ctx, dy2, a.rows,
        [&](const Tensor& t, size_t g) {
            return cast(ctx, f, t, f.recipe.grad_output, a.grad_output[g], 0, f.tp.grad_output);
        },
        weight_operand(ctx, f, w, a.weight, 1), false, dx2);
}

void float8_weight_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                        const Tensor& x2, Tensor& dw) {
    const PricedAs priced(dy2);
    for (size_t g = 0; g < a.rows.size(); ++g) {  // each rank's own GEMM, added to the gradient in rank order
        const Float8Operand d = cast(ctx, f, rows_of(dy2, a.rows[g]), f.recipe.grad_output, a.grad_output[g],
                                     1, f.tp.grad_output);
        const Float8Operand x =
            cast(ctx, f, rows_of(x2, a.rows[g]), f.recipe.input, a.input[g], 1, f.tp.input);
        Tensor part = Tensor::empty(dw.shape(), dw.dtype(), dw.device());
        float8_gemm(*ctx.backend, d, true, x, false, part);
        const Float8EmulationOnly handed_over;  // torchao's GEMM writes the gradient itself
        ctx.backend->axpy(1.0, part, dw);
    }
}

}  // namespace ptool
