// A linear's three GEMMs in float8, as torchao's Float8Linear runs them (issue 48; docs/float8.md).
// Recipe tensorwise: one dynamic scale per tensor from its amax (float8_tensorwise_scale), the
// input and the weight in e4m3fn, the output's gradient in e5m2; each GEMM on the exact float8
// values accumulating in float32, times (1/scale_a)(1/scale_b), written in the compute dtype
// (model/float8_gemm.h). The bias stays in the compute dtype, outside the GEMM, as torchao adds it.
// Recipe rowwise (torchao's ROWWISE): every operand e4m3fn, one scale per row or column along each
// GEMM's reduction dim (forward: x per row, W per row; grad input: dy per row, W per column; grad
// weight: dy and x per column, over each rank's rows), each rounded down to a power of 2.
// Recipe rowwise_with_gw_hp (torchao's ROWWISE_WITH_GW_HP): the forward as rowwise; the input
// gradient dy per row times W with one tensorwise scale (the whole weight's amax), both e4m3fn,
// power-of-2 scales; the weight gradient dy^T x in the compute dtype, as a plain linear's.
//
// A scale covers the whole tensor it scales as torchao sees it, a DTensor's pieces included:
//   - a tensor-parallel shard's amax is reduced (max) over tp (Float8TpPieces): the weight of a
//     colwise or rowwise linear, an input or output gradient whose layout is a Shard (a rowwise
//     input's Shard(-1), a colwise output gradient's, a sequence-parallel Shard(1)); under the
//     rowwise recipe only where tp cuts the dim a row's or column's amax runs along (a DTensor's
//     max along a sharded dim), which is the GEMM's reduction dim: the forward's under a rowwise
//     style, the input gradient's under a colwise one, the weight gradient's (tokens) under
//     sequence parallelism;
//   - fully_shard gathers the weight before the forward: its amax is the whole weight's already;
//     with FSDP2's float8 all-gather the weight arrives cast (Parameter::float8_scale: the codes
//     and the scale fully_shard took over the shards, parallel/fully_shard.h) and is used so.
// Data parallel ranks hold different batches and context parallel ranks different positions of
// each sequence, and each scales its own (as torchao under DDP and FSDP2, and under torchtitan's
// context_parallel, which shards the sequence in place: an activation is the rank's plain local
// tensor). verify's reference on one device runs every rank's rows at once, so it scales each
// rank's rows apart (RunContext's float8_row_groups: the plan's data and cp ranks, a cp rank's
// rows its chunks of positions of every sequence), which is what the ranks compute.
//
// The backward casts the input and the weight again from the tensors its forward kept, as torchao
// does (the same amax, so the same float8 values; rowwise_with_gw_hp casts no input there and its
// weight with one scale); the output's gradient gets its own scale.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/float8.h"
#include "core/tensor_ops.h"

namespace ptool {

class Communicator;
class Tensor;
struct Parameter;
struct RunContext;

// torchao's scaling granularity: one scale per tensor, or (its rowwise recipe) one per row or
// column along each GEMM's reduction dim, rounded down to a power of 2.
enum class Float8Scaling { tensorwise, rowwise };

// torchao's Float8LinearConfig for the recipe, and the fault layer's seam (verify/faults.h): a
// recipe with reduce_amax false scales a shard by its own amax; one with grad_output e4m3fn casts
// the gradients in the forward's format; a rowwise one without power_of_2_scales keeps its scales
// as the amaxes give them.
struct Float8Recipe {
    Float8Scaling scaling = Float8Scaling::tensorwise;
    Float8Format input = Float8Format::e4m3fn, weight = Float8Format::e4m3fn,
                 grad_output = Float8Format::e5m2;
    bool reduce_amax = true;         // over the ranks holding pieces of the tensor a scale covers
    bool power_of_2_scales = false;  // round_scales_to_power_of_2 (the rowwise recipes': every scale)
    // torchao's cast_config_weight_for_grad_input TENSORWISE under axiswise scaling: the input
    // gradient's weight one scale (rowwise_with_gw_hp's)
    bool weight_tensorwise_for_grad_input = false;
    // the weight gradient's casts DISABLED: dy^T x in the compute dtype (rowwise_with_gw_hp's)
    bool grad_weight_high_precision = false;
};
// torchao's recipes by name (Float8LinearRecipeName): tensorwise (the default above), rowwise
// (every operand e4m3fn, axiswise scales, round_scales_to_power_of_2) and rowwise_with_gw_hp
// (rowwise's forward, a tensorwise weight in the input gradient, a high-precision weight
// gradient); false for another name.
bool float8_recipe_named(const std::string& name, Float8Recipe* out);
const std::vector<std::string>& float8_recipe_names();   // every name float8_recipe_named takes
const char* float8_recipe_name(const Float8Recipe& r);   // its recipe's name, whatever faults changed
const char* float8_recipe_casts(const Float8Recipe& r);  // its casts in words (explain's summary)
const char* float8_scaling_name(Float8Scaling s);        // the recipe of that scaling's name

// Which dims of a linear's operand, seen as a matrix, tensor parallelism cuts over tp: its rows
// (an activation's tokens, a weight's out features) or its columns (an activation's features, a
// weight's in features). A tensorwise scale is reduced over tp where either is cut; a rowwise
// scale (one per row or column) where the dim its amax runs along is.
struct Float8Cut {
    bool rows = false, cols = false;
    bool any() const { return rows || cols; }
    Float8Cut& operator|=(Float8Cut o) { return rows |= o.rows, cols |= o.cols, *this; }
};

// Which of a linear's tensors tensor parallelism cuts into pieces over tp (its style's placements
// and the layout pass's: parallel/float8_training.h resolves them once).
struct Float8TpPieces {
    Float8Cut weight, input, grad_output;
};

struct Float8Gemms {
    Float8Recipe recipe;
    Float8TpPieces tp;
    std::string fqn;  // the linear's (verify's float8 log keys on it: model/float8_log.h); empty: not logged
};

// Each piece's amax (NaN where it holds one) reduced (max) over `over` (unless !reduce), the
// pieces' amaxes stacked in one all_reduce per group: the amax of the whole tensor each is a
// piece of. Meta pieces read nothing and reduce the same (a simulation counts what a run does).
std::vector<double> float8_amax_over(const std::vector<Tensor>& pieces,
                                     const std::vector<Communicator*>& over, bool reduce = true);
// Amaxes taken already (NaN where a piece holds one) reduced so, in one all_reduce per group.
std::vector<double> float8_max_over(const std::vector<double>& amax, Device device,
                                    const std::vector<Communicator*>& over, bool reduce = true);

// The row ranges of one rank's local tensor within an activation's rows (RunContext's
// float8_row_groups): one range on a rank.
using Float8Rows = std::vector<Chunk>;

// y2 = x2 w^T ([rows, in] x [out, in] -> [rows, out]); x2's rows are sequences of `seq` positions
// (where cp cuts them).
void float8_forward(RunContext& ctx, const Float8Gemms& f, const Tensor& x2, const Parameter& w, Tensor& y2,
                    int64_t seq = 1);

// The backward's scales: the output's gradient's and the input's (one per data rank's rows), the
// weight's (none for a weight gathered in float8: its scale came with it); taken once at the
// backward and kept by a split backward's W.
struct Float8BackwardAmax {
    std::vector<Float8Rows> rows;  // each rank's rows (row_groups)
    std::vector<double> grad_output, input;
    double weight = 0;
    // The activations the backward's casts take: the backward's own, or under verify the copies that
    // follow the reference's at near-ties (model/float8_log.h); the amaxes are theirs. (Not the
    // weight, whose full tensor a split backward's W must not keep past fully_shard's reshard: the
    // input gradient takes it again.)
    Tensor grad_output_values, input_values;
};
Float8BackwardAmax float8_backward_amax(RunContext& ctx, const Float8Gemms& f, const Tensor& dy2,
                                        const Tensor& x2, const Parameter& w, int64_t seq = 1);
// dx2 = dy2 w ([rows, out] x [out, in] -> [rows, in]).
void float8_input_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                       const Parameter& w, Tensor& dx2);
// dw += dy2^T x2 ([out, rows] x [rows, in]): each data rank's rows one GEMM, added in rank order
// (rowwise_with_gw_hp: one GEMM of every row in the compute dtype, a plain linear's).
void float8_weight_grad(RunContext& ctx, const Float8Gemms& f, const Float8BackwardAmax& a, const Tensor& dy2,
                        const Tensor& x2, Tensor& dw);

}  // namespace ptool
