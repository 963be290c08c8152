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
#include "model/float8_log.h"
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

// Where each row of one rank's operand t2 ([n, cols]) lies in the reference's (model/float8_log.h),
// as the reference's row index (-1: none): a weight's rows by the tp chunk where tp cuts them; an
// activation's tokens (rows of `seq` positions) by the data rank's first row, the cp rank's
// positions and the tp chunk of them where tp cuts the tokens (sequence parallel's Shard(1)). Empty
// where the shapes do not line up (then nothing is followed).
std::vector<int64_t> reference_rows(const RunContext& ctx, const Float8Logged& ref, Float8Role role,
                                    int64_t n, int64_t seq, bool rows_cut) {
    std::vector<int64_t> at(static_cast<size_t>(n), -1);
    if (role == Float8Role::weight) {
        const Chunk c = rows_cut ? chunk_of(ref.rows, ctx.tp_parts, ctx.tp_rank) : Chunk{0, ref.rows};
        if (c.length != n) return {};
        for (int64_t i = 0; i < n; ++i) at[static_cast<size_t>(i)] = c.offset + i;
        return at;
    }
    if (seq <= 0 || n % seq != 0 || (rows_cut && seq == 1)) return {};  // a 2-D activation cut by tp: not
    const int64_t positions =  // the sequence's positions here before tp cuts them
        ctx.context ? static_cast<int64_t>(ctx.context->positions.size()) : ref.seq;
    const Chunk c = rows_cut ? chunk_of(positions, ctx.tp_parts, ctx.tp_rank) : Chunk{0, positions};
    if (c.length != seq) return {};
    for (int64_t i = 0; i < n / seq; ++i)
        for (int64_t j = 0; j < seq; ++j) {
            const int64_t here = c.offset + j;
            const int64_t pos = ctx.context ? ctx.context->positions[static_cast<size_t>(here)] : here;
            const int64_t g = (ctx.row_offset + i - ref.first_row) * ref.seq + pos;
            if (g >= 0 && g < ref.rows * ref.seq && pos < ref.seq) at[static_cast<size_t>(i * seq + j)] = g;
        }
    return at;
}

// t2 as this rank casts it under verify (model/float8_log.h): the reference logs its operand; a
// parallel run takes the reference's value for each element its own agrees with within the
// tolerance, so that a near-tie rounds as the reference's did (in t2's dtype: the reference's
// values are its dtype's). Anything else: t2 itself.
Tensor follow_reference(const RunContext& ctx, const Float8Gemms& f, Float8Role role, const Tensor& t2,
                        int64_t seq, Float8Cut cut) {
    Float8Log* log = ctx.float8_log;
    if (!log || f.fqn.empty() || t2.device() == Device::meta || t2.dim() != 2) return t2;
    const int mb = role == Float8Role::weight ? 0 : ctx.microbatch;  // a weight is the step's: once
    const Float8Logged* ref = log->find(ctx.step, mb, f.fqn, role);
    // the reference logs each operand once (a backward's input is its forward's); a parallel run
    // follows what the reference logged
    if (ctx.float8_replays != (ref != nullptr)) return t2;
    const MemoryScope unaccounted(nullptr);  // verification's own copies: the run's memory is the run's
    // on the host (a GPU's operand copied: the log and the rule are host work)
    Tensor f32 = t2.dtype() == DType::float32 ? t2 : to_dtype(*ctx.backend, t2, DType::float32);
    if (f32.device() != Device::cpu) f32 = f32.to_device(Device::cpu);
    const float* own = f32.data<float>();
    if (!ref) {
        Float8Logged v;
        const bool weight = role == Float8Role::weight;
        v.first_row = weight ? 0 : ctx.row_offset, v.seq = weight ? 1 : std::max<int64_t>(seq, 1);
        v.cols = t2.size(1), v.rows = t2.size(0) / v.seq;
        v.values.assign(own, own + f32.numel());
        v.measure();
        log->record(ctx.step, mb, f.fqn, role, std::move(v));
        return t2;
    }
    const int64_t n = t2.size(0), cols = t2.size(1);
    // an output gradient at this rank's scale (Run::activation_grad_scale)
    const double to_own = role == Float8Role::grad_output ? 1.0 / ctx.reference_grad_scale : 1.0;
    const Chunk c = cut.cols ? chunk_of(ref->cols, ctx.tp_parts, ctx.tp_rank) : Chunk{0, ref->cols};
    const std::vector<int64_t> at = reference_rows(ctx, *ref, role, n, seq, cut.rows);
    if (c.length != cols || at.empty()) return t2;
    Tensor out = f32.clone();
    float* took = out.data<float>();
    int64_t taken = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (at[static_cast<size_t>(i)] < 0) continue;
        const int64_t g = at[static_cast<size_t>(i)];
        const float* want = ref->values.data() + g * ref->cols + c.offset;
        for (int64_t j = 0; j < cols; ++j) {
            const double v = own[i * cols + j], r = static_cast<float>(want[j] * to_own);
            const double ra = ref->row_amax[static_cast<size_t>(g)],
                         ca = ref->col_amax[static_cast<size_t>(c.offset + j)];
            const double scale = std::isnan(ra) || std::isnan(ca) ? ra + ca : std::min(ra, ca),
                         bound = log->rtol() * std::fabs(r) + log->atol() * scale * to_own;
            // a NaN or an infinity on either side, or in r's row or column, is never agreed
            if (v == r || !std::isfinite(v) || !std::isfinite(r) || !std::isfinite(bound) ||
                !(std::fabs(v - r) <= bound))
                continue;
            took[i * cols + j] = static_cast<float>(r), ++taken;
        }
    }
    log->count_taken(taken);
    if (t2.device() != Device::cpu) out = out.to_device(t2.device());
    return out.dtype() == t2.dtype() ? out : to_dtype(*ctx.backend, out, t2.dtype());
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

// Whether the weight holds float8 codes (FSDP2's float8 all-gather, or the reference's copy of it):
// by its dtype, not its scale (an amax of NaN or infinity gives a scale that is no flag).
bool gathered_codes(const Parameter& w) {
    return w.value.dtype() == DType::uint8;
}

// The weight's values as its casts take them: under verify, followed (follow_reference); its float8
// codes where FSDP2 gathered it in float8.
Tensor weight_values(const RunContext& ctx, const Float8Gemms& f, const Parameter& w) {
    return gathered_codes(w) ? w.value
                             : follow_reference(ctx, f, Float8Role::weight, w.value, 1, f.tp.weight);
}

// Whether the weight is cast with one scale for the forward (axis 0) or the input gradient (axis 1).
bool weight_tensorwise(const Float8Gemms& f, int axis) {
    return !rowwise(f) || (axis == 1 && f.recipe.weight_tensorwise_for_grad_input);
}

// The weight's amax where one scale covers it (its scale came with it where gathered in float8;
// an axiswise cast takes its own).
double weight_amax(const RunContext& ctx, const Float8Gemms& f, const Parameter& w, const Tensor& values,
                   int axis) {
    if (gathered_codes(w) || !weight_tensorwise(f, axis)) return 0;
    return float8_amax_over({values}, tp_shards(ctx, f.tp.weight.any()), f.recipe.reduce_amax)[0];
}

// The weight as a GEMM operand: as gathered in float8, or its values cast (rowwise along `axis`:
// per row of W for the forward, per column for the input gradient; rowwise_with_gw_hp's input
// gradient one power-of-2 scale).
Float8Operand weight_operand(const RunContext& ctx, const Float8Gemms& f, const Parameter& w,
                             const Tensor& values, double amax, int axis) {
    if (gathered_codes(w)) return float8_from_codes(w.value, f.recipe.weight, w.float8_scale);
    if (rowwise(f) && weight_tensorwise(f, axis))
        return float8_tensorwise(values, f.recipe.weight, amax, f.recipe.power_of_2_scales);
    return cast(ctx, f, values, f.recipe.weight, amax, axis, f.tp.weight);
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

// torchao's Float8LinearRecipeName, each as Float8LinearConfig.from_recipe_name builds it.
struct RecipeRow {
    const char* name;
    Float8Recipe recipe;
    const char* casts;  // float8_recipe_casts'
};
constexpr Float8Recipe kRowwise{
    .scaling = Float8Scaling::rowwise, .grad_output = Float8Format::e4m3fn, .power_of_2_scales = true};
const RecipeRow kRecipeRows[] = {
    {"tensorwise", Float8Recipe{}, "e4m3fn inputs and weights, e5m2 output gradients"},
    {"rowwise", kRowwise, "e4m3fn throughout, a power-of-2 scale per row or column"},
    {"rowwise_with_gw_hp",
     [] {
         Float8Recipe r = kRowwise;
         r.weight_tensorwise_for_grad_input = r.grad_weight_high_precision = true;
         return r;
     }(),
     "e4m3fn, a power-of-2 scale per row or column, one for the input gradient's weight; the weight "
     "gradient in the compute dtype"},
};

const RecipeRow* row_of(const Float8Recipe& r) {
    // by what the fault classes leave alone (they change a scale's reduction, a format, the rounding)
    for (const RecipeRow& row : kRecipeRows)
        if (row.recipe.scaling == r.scaling &&
            row.recipe.weight_tensorwise_for_grad_input == r.weight_tensorwise_for_grad_input &&
            row.recipe.grad_weight_high_precision == r.grad_weight_high_precision)
            return &row;
    return nullptr;
}

}  // namespace

bool float8_recipe_named(const std::string& name, Float8Recipe* out) {
    for (const RecipeRow& row : kRecipeRows)
        if (name == row.name) return *out = row.recipe, true;
    return false;
}

const std::vector<std::string>& float8_recipe_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> out;
        for (const RecipeRow& row : kRecipeRows) out.emplace_back(row.name);
        return out;
    }();
    return names;
}

const char* float8_recipe_name(const Float8Recipe& r) {
    const RecipeRow* row = row_of(r);
    return row ? row->name : float8_scaling_name(r.scaling);
}

const char* float8_recipe_casts(const Float8Recipe& r) {
    const RecipeRow* row = row_of(r);
    return row ? row->casts : "";
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
    // the operands as cast, and their amaxes (so a scale follows the reference's where they agree)
    const Tensor xs = follow_reference(ctx, f, Float8Role::input, x2, seq, f.tp.input),
                 ws = weight_values(ctx, f, w);
    const std::vector<double> ax = activation_amax(ctx, f, xs, groups, f.tp.input.any());
    const double aw = weight_amax(ctx, f, w, ws, 0);
    const PricedAs priced(x2);
    by_row_groups(
        ctx, xs, groups,
        [&](const Tensor& t, size_t g) { return cast(ctx, f, t, f.recipe.input, ax[g], 0, f.tp.input); },
        weight_operand(ctx, f, w, ws, aw, 0), true, y2);
}

Float8BackwardAmax float8_backward_amax(RunContext& ctx, const Float8Gemms& f, const Tensor& dy2,
                                        const Tensor& x2, const Parameter& w, int64_t seq) {
    Float8BackwardAmax a;
    a.rows = row_groups(ctx, dy2.size(0), seq);
    a.grad_output_values = follow_reference(ctx, f, Float8Role::grad_output, dy2, seq, f.tp.grad_output);
    // (rowwise_with_gw_hp: the weight gradient's GEMM takes x as it is, uncast)
    const bool hp = f.recipe.grad_weight_high_precision;
    a.input_values = hp ? x2 : follow_reference(ctx, f, Float8Role::input, x2, seq, f.tp.input);
    a.grad_output = activation_amax(ctx, f, a.grad_output_values, a.rows, f.tp.grad_output.any());
    a.input = hp ? std::vector<double>(a.rows.size(), 0.0)
                 : activation_amax(ctx, f, a.input_values, a.rows, f.tp.input.any());
    a.weight = weight_amax(ctx, f, w, weight_values(ctx, f, w), 1);
    return a;
}

void float8_input_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                       const Parameter& w, Tensor& dx2) {
    const PricedAs priced(dy2);
    by_row_groups(
        ctx, a.grad_output_values, a.rows,
        [&](const Tensor& t, size_t g) {
            return cast(ctx, f, t, f.recipe.grad_output, a.grad_output[g], 0, f.tp.grad_output);
        },
        weight_operand(ctx, f, w, weight_values(ctx, f, w), a.weight, 1), false, dx2);
}

void float8_weight_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                        const Tensor& x2, Tensor& dw) {
    // rowwise_with_gw_hp: the plain linear's GEMM on the unscaled dy and x (torchao's torch.mm of
    // the high-precision tensors), over every row at once as autograd's
    if (f.recipe.grad_weight_high_precision) return ctx.backend->gemm(dy2, true, x2, false, dw, 1.0, 1.0);
    const PricedAs priced(dy2);
    PTOOL_REQUIRE(x2.numel() == a.input_values.numel(), "float8: a weight gradient of another input");
    for (size_t g = 0; g < a.rows.size(); ++g) {  // each rank's own GEMM, added to the gradient in rank order
        const Float8Operand d = cast(ctx, f, rows_of(a.grad_output_values, a.rows[g]), f.recipe.grad_output,
                                     a.grad_output[g], 1, f.tp.grad_output);
        const Float8Operand x =
            cast(ctx, f, rows_of(a.input_values, a.rows[g]), f.recipe.input, a.input[g], 1, f.tp.input);
        Tensor part = Tensor::empty(dw.shape(), dw.dtype(), dw.device());
        float8_gemm(*ctx.backend, d, true, x, false, part);
        const Float8EmulationOnly handed_over;  // torchao's GEMM writes the gradient itself
        ctx.backend->axpy(1.0, part, dw);
    }
}

}  // namespace ptool
