#include "model/float8_gemm.h"

#include <cmath>
#include <limits>

#include "core/device_memory.h"
#include "core/error.h"
#include "model/float8_cost.h"

namespace ptool {
namespace {

// x in float32 (a copy unless it is): on meta the same allocation, no values, so a simulation
// holds what a run holds.
Tensor as_float32(const Tensor& x) {
    if (x.dtype() == DType::float32) return x;
    if (x.device() == Device::meta) return Tensor::empty(x.shape(), DType::float32, Device::meta);
    PTOOL_REQUIRE(x.device() == Device::cpu, "a float8 cast of a tensor on {}", device_name(x.device()));
    return to_dtype(backend_for(Device::cpu), x, DType::float32);
}

}  // namespace

double float8_amax(const Tensor& x) {
    const Tensor f = as_float32(x);
    if (f.device() == Device::meta) return 0;
    const float* p = f.data<float>();
    double amax = 0;
    for (int64_t i = 0; i < f.numel(); ++i) {
        if (std::isnan(p[i])) return std::numeric_limits<double>::quiet_NaN();
        amax = std::max(amax, static_cast<double>(std::fabs(p[i])));
    }
    return amax;
}

Float8Operand float8_tensorwise(const Tensor& x, Float8Format f, double amax) {
    float8_count_cast(x);
    Float8Operand out;
    out.format = f, out.scale = float8_tensorwise_scale(amax, f);
    const Tensor in = as_float32(x);
    out.values = Tensor::empty(in.shape(), DType::float32, in.device());
    if (in.device() == Device::meta) return out;
    const float* p = in.data<float>();
    float* q = out.values.data<float>();
    for (int64_t i = 0; i < in.numel(); ++i) q[i] = float8_round(p[i] * out.scale, f);  // float32 product
    return out;
}

Float8Operand float8_from_codes(const Tensor& codes, Float8Format f, float scale) {
    PTOOL_REQUIRE(codes.dtype() == DType::uint8, "float8 codes held as {}", dtype_name(codes.dtype()));
    Float8Operand out;
    out.format = f, out.scale = scale;
    out.values = Tensor::empty(codes.shape(), DType::float32, codes.device());
    if (codes.device() == Device::meta) return out;
    PTOOL_REQUIRE(codes.device() == Device::cpu, "float8 codes on {}", device_name(codes.device()));
    const uint8_t* p = codes.data<uint8_t>();
    float* q = out.values.data<float>();
    for (int64_t i = 0; i < codes.numel(); ++i) q[i] = float8_decode(p[i], f);
    return out;
}

void float8_cast_codes(const Tensor& x, Float8Format f, float scale, Tensor& codes) {
    PTOOL_REQUIRE(codes.dtype() == DType::uint8 && codes.numel() == x.numel(),
                  "float8 codes of {} into {} {}", shape_str(x.shape()), dtype_name(codes.dtype()),
                  shape_str(codes.shape()));
    float8_count_scaled_cast(x);
    const Tensor in = as_float32(x);
    if (in.device() == Device::meta) return;
    const float* p = in.data<float>();
    uint8_t* q = codes.data<uint8_t>();
    for (int64_t i = 0; i < in.numel(); ++i)
        q[i] = float8_encode_saturated(p[i] * scale, f);  // float32 product
}

void float8_gemm(Backend& be, const Float8Operand& a, bool trans_a, const Float8Operand& b, bool trans_b,
                 Tensor& out) {
    float8_count_layouts(a.values, trans_a, b.values, trans_b);
    Tensor acc = Tensor::empty(out.shape(), DType::float32, out.device());
    be.gemm(a.values, trans_a, b.values, trans_b, acc);
    const float alpha = (1.0f / a.scale) * (1.0f / b.scale);
    const Float8EmulationOnly epilogue;  // torch._scaled_mm's, on chip
    Tensor scaled = Tensor(out.shape(), DType::float32, out.device());
    be.axpy(alpha, acc, scaled);
    be.copy(scaled, out);  // to out's dtype
}

}  // namespace ptool
