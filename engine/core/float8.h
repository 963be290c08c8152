// Float8 numbers as PyTorch and torchao compute them (issue 48: the formats, the casts and
// torchao's tensorwise scale; model/float8_gemm.h their GEMM; not yet a module or a plan key).
//
//   e4m3fn  1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, NaN = S.1111.111; largest
//           finite 448 (S.1111.110), smallest normal 2^-6, smallest subnormal 2^-9. The forward's
//           format (inputs and weights).
//   e5m2    1 sign, 5 exponent (bias 15), 2 mantissa bits; infinities S.11111.00, NaN S.11111.{01,
//           10,11}; largest finite 57344, smallest normal 2^-14, smallest subnormal 2^-16. The
//           backward's format (output gradients).
//
// float8_encode is PyTorch's `x.to(torch.float8_*)` (c10's fp8e4m3fn_from_fp32_value and
// fp8e5m2_from_fp32_value): round to nearest, ties to even, on the float32 value; past the largest
// finite value by more than half a step e4m3fn gives NaN and e5m2 infinity. torchao never casts
// raw: its to_fp8_saturated clamps to +-max first (float8_encode_saturated); NaN stays NaN.
// torchao's tensorwise scale (amax_to_scale) is max / max(amax, 1e-12), computed in float64 and
// rounded to float32; a tensor goes to float8 as encode_saturated(x * scale) and comes back as
// decode(bits) / scale. Debian's PyTorch 1.13 has no float8 dtype: tests/test_float8.cpp holds these
// to c10's bit-level algorithm written out there.
#pragma once

#include <cstdint>

namespace ptool {

enum class Float8Format { e4m3fn, e5m2 };

struct Float8Info {
    Float8Format format;
    const char* name;  // torch's: "float8_e4m3fn", "float8_e5m2"
    int exponent_bits, mantissa_bits, bias;
    double max;         // the largest finite value
    double min_normal;  // 2^(1 - bias)
    double min_subnormal;
};
const Float8Info& float8_info(Float8Format f);

float float8_decode(uint8_t bits, Float8Format f);
uint8_t float8_encode(float x, Float8Format f);            // torch's cast
uint8_t float8_encode_saturated(float x, Float8Format f);  // torchao's to_fp8_saturated
// The float8 value x rounds to (saturated), as a float: decode(encode_saturated(x)).
float float8_round(float x, Float8Format f);
// torchao's amax_to_scale for a tensor whose largest magnitude is `amax`.
float float8_tensorwise_scale(double amax, Float8Format f);
// torchao's round_scales_to_power_of_2 (its rowwise recipe's): exp2(floor(log2(scale))) in float32.
float float8_power_of_2(float scale);

}  // namespace ptool
