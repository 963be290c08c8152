// torchao's Float8Linear GEMM with tensorwise scales, emulated on any backend (issue 48; not yet
// used by a module: docs/float8.md). An operand goes to float8 as torchao casts it: its scale from
// the amax of the whole tensor (float8_tensorwise_scale: the caller all-reduces the amax over the
// shards of a sharded tensor), each element x * scale in float32 cast saturated (core/float8.h);
// kept as the exact float8 values in float32. The product is the float32 GEMM of those values
// (float8 products are exact in float32 and the accumulation is float32, as cuBLASLt's) times
// (1/scale_a)(1/scale_b) in float32 (torch._scaled_mm's alpha), written in the output's dtype.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "core/float8.h"

namespace ptool {

struct Float8Operand {
    Tensor values;      // float32: each element a float8 value of `format`
    float scale = 1.f;  // what the tensor was multiplied by before the cast
    Float8Format format = Float8Format::e4m3fn;
    // torchao's axiswise (rowwise recipe) scales instead: one per row (axis 0) or per column
    // (axis 1) of values; empty: the tensorwise `scale`
    std::vector<float> scales;
    int axis = 0;
};

// The largest magnitude of a host tensor (NaN when it holds one, as torch.max(abs(x))).
double float8_amax(const Tensor& x);
// x (a host tensor) cast as torchao does with the scale of `amax` (float8_amax(x), or its max over
// the shards of the tensor x is one of), rounded down to a power of 2 where `power_of_2`
// (round_scales_to_power_of_2: rowwise_with_gw_hp's tensorwise weight).
Float8Operand float8_tensorwise(const Tensor& x, Float8Format f, double amax, bool power_of_2 = false);
// Each row's (axis 0) or column's (axis 1) largest magnitude of a host tensor [r, c] (NaN where
// it holds one); meta: zeros.
std::vector<double> float8_amax_axis(const Tensor& x, int axis);
// x [r, c] cast with one scale per row (axis 0) or column (axis 1), each torchao's amax_to_scale of
// its `amax`, rounded down to a power of 2 where `power_of_2` (the rowwise recipe's).
Float8Operand float8_axiswise(const Tensor& x, Float8Format f, const std::vector<double>& amax, int axis,
                              bool power_of_2);
// A tensor already cast: its float8 codes (uint8) of format f, cast with `scale` (FSDP2's float8
// all-gather hands a weight over so).
Float8Operand float8_from_codes(const Tensor& codes, Float8Format f, float scale);
// codes = x cast as float8_tensorwise casts it, with `scale` given: the codes themselves (uint8).
void float8_cast_codes(const Tensor& x, Float8Format f, float scale, Tensor& codes);
// out = op(a) op(b) / (scale_a scale_b), out's dtype; axiswise operands' scales along op(a)'s rows
// and op(b)'s columns (torch._scaled_mm's rowwise scales: out[m, n] = acc * (1/sa[m]) * (1/sb[n])).
void float8_gemm(Backend& be, const Float8Operand& a, bool trans_a, const Float8Operand& b, bool trans_b,
                 Tensor& out);

}  // namespace ptool
