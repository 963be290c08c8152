#include "model/float8_gemm.h"

#include <cmath>
#include <limits>

#include "core/device_memory.h"
#include "core/error.h"
#include "model/float8_cost.h"

namespace ptool {
namespace {

// x in float32 (a copy unless it is), where it lives: on meta the same allocation, no values, so a
// simulation holds what a run holds; on a GPU converted there, as on the host.
Tensor as_float32(const Tensor& x) {
    if (x.dtype() == DType::float32) return x;
    if (x.device() == Device::meta) return Tensor::empty(x.shape(), DType::float32, Device::meta);
    return to_dtype(backend_for(x.device()), x, DType::float32);
}

// The emulation's per-element work runs on the host (the CUDA backend has no float8 kernels:
// docs/float8.md): a tensor on a GPU is staged through host copies that no memory account counts,
// so that a run holds on either device what the simulation holds.
Tensor on_host(const Tensor& x) {
    if (x.device() == Device::cpu || x.device() == Device::meta) return x;
    const MemoryScope unaccounted(nullptr);
    return x.to_device(Device::cpu);
}

// out = fn(in's values) element by element on the host, written where out lives (nothing on meta).
// fn(const In* in, Out* out).
template <class In, class Out, class Fn>
void map_on_host(const Tensor& in, Tensor& out, Fn fn) {
    if (in.device() == Device::meta || out.device() == Device::meta) return;
    const Tensor h = on_host(in);
    if (out.device() == Device::cpu) return fn(h.data<In>(), out.data<Out>());
    const MemoryScope unaccounted(nullptr);
    Tensor staged = Tensor::empty(out.shape(), out.dtype(), Device::cpu);
    fn(h.data<In>(), staged.data<Out>());
    copy_bytes(out.raw(), out.device(), staged.raw(), Device::cpu, out.nbytes());
}

}  // namespace

double float8_amax(const Tensor& x) {
    const Tensor f = on_host(as_float32(x));
    if (f.device() == Device::meta) return 0;
    const float* p = f.data<float>();
    double amax = 0;
    for (int64_t i = 0; i < f.numel(); ++i) {
        if (std::isnan(p[i])) return std::numeric_limits<double>::quiet_NaN();
        amax = std::max(amax, static_cast<double>(std::fabs(p[i])));
    }
    return amax;
}

Float8Operand float8_tensorwise(const Tensor& x, Float8Format f, double amax, bool power_of_2) {
    float8_count_cast(x);
    Float8Operand out;
    out.format = f, out.scale = float8_tensorwise_scale(amax, f);
    if (power_of_2) out.scale = float8_power_of_2(out.scale);
    const Tensor in = as_float32(x);
    out.values = Tensor::empty(in.shape(), DType::float32, in.device());
    const float scale = out.scale;
    map_on_host<float, float>(in, out.values, [&](const float* p, float* q) {
        for (int64_t i = 0; i < in.numel(); ++i) q[i] = float8_round(p[i] * scale, f);  // float32 product
    });
    return out;
}

Float8Operand float8_from_codes(const Tensor& codes, Float8Format f, float scale) {
    PTOOL_REQUIRE(codes.dtype() == DType::uint8, "float8 codes held as {}", dtype_name(codes.dtype()));
    Float8Operand out;
    out.format = f, out.scale = scale;
    out.values = Tensor::empty(codes.shape(), DType::float32, codes.device());
    map_on_host<uint8_t, float>(codes, out.values, [&](const uint8_t* p, float* q) {
        for (int64_t i = 0; i < codes.numel(); ++i) q[i] = float8_decode(p[i], f);
    });
    return out;
}

void float8_cast_codes(const Tensor& x, Float8Format f, float scale, Tensor& codes) {
    PTOOL_REQUIRE(codes.dtype() == DType::uint8 && codes.numel() == x.numel(),
                  "float8 codes of {} into {} {}", shape_str(x.shape()), dtype_name(codes.dtype()),
                  shape_str(codes.shape()));
    float8_count_scaled_cast(x);
    const Tensor in = as_float32(x);
    map_on_host<float, uint8_t>(in, codes, [&](const float* p, uint8_t* q) {
        for (int64_t i = 0; i < in.numel(); ++i)
            q[i] = float8_encode_saturated(p[i] * scale, f);  // float32 product
    });
}

std::vector<double> float8_amax_axis(const Tensor& x, int axis) {
    PTOOL_REQUIRE(x.dim() == 2 && (axis == 0 || axis == 1), "float8 axiswise amax of {} along {}",
                  shape_str(x.shape()), axis);
    const int64_t rows = x.size(0), cols = x.size(1);
    std::vector<double> out(axis == 0 ? rows : cols, 0.0);
    const Tensor f = on_host(as_float32(x));
    if (f.device() == Device::meta) return out;
    const float* p = f.data<float>();
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            double& m = out[axis == 0 ? i : j];
            const float v = p[i * cols + j];
            m = std::isnan(v) || std::isnan(m) ? std::numeric_limits<double>::quiet_NaN()
                                               : std::max(m, static_cast<double>(std::fabs(v)));
        }
    return out;
}

Float8Operand float8_axiswise(const Tensor& x, Float8Format f, const std::vector<double>& amax, int axis,
                              bool power_of_2) {
    float8_count_cast(x);  // torchao's axiswise cast: abs, amax along a dim, the scales, the scaled cast
    Float8Operand out;
    out.format = f, out.axis = axis;
    for (double a : amax) {
        const float s = float8_tensorwise_scale(a, f);
        out.scales.push_back(power_of_2 ? float8_power_of_2(s) : s);
    }
    const Tensor in = as_float32(x);
    out.values = Tensor::empty(in.shape(), DType::float32, in.device());
    const int64_t cols = in.size(1);
    map_on_host<float, float>(in, out.values, [&](const float* p, float* q) {
        for (int64_t i = 0; i < in.numel(); ++i)
            q[i] = float8_round(p[i] * out.scales[axis == 0 ? i / cols : i % cols], f);  // float32 product
    });
    return out;
}

namespace {

// 1 / the scale of each of op(x)'s rows (along_rows) or columns: x's axiswise scales where they lie
// along it, else its tensorwise scale for all n
std::vector<float> inverse_scales(const Float8Operand& x, int64_t n, int axis) {
    if (x.scales.empty()) return std::vector<float>(n, 1.0f / x.scale);
    PTOOL_REQUIRE(x.axis == axis && static_cast<int64_t>(x.scales.size()) == n,
                  "float8 GEMM: {} scales along axis {} where {} along axis {} are needed", x.scales.size(),
                  x.axis, n, axis);
    std::vector<float> out;
    for (float s : x.scales) out.push_back(1.0f / s);
    return out;
}

}  // namespace

void float8_gemm(Backend& be, const Float8Operand& a, bool trans_a, const Float8Operand& b, bool trans_b,
                 Tensor& out) {
    float8_count_layouts(a.values, trans_a, b.values, trans_b);
    Tensor acc = Tensor::empty(out.shape(), DType::float32, out.device());
    be.gemm(a.values, trans_a, b.values, trans_b, acc);
    const Float8EmulationOnly epilogue;  // torch._scaled_mm's, on chip
    Tensor scaled = Tensor(out.shape(), DType::float32, out.device());
    if (a.scales.empty() && b.scales.empty()) {
        const float alpha = (1.0f / a.scale) * (1.0f / b.scale);
        be.axpy(alpha, acc, scaled);
    } else if (out.device() != Device::meta) {  // rowwise: acc * (1/sa[m]) * (1/sb[n]), in float32
        const int64_t m = out.size(0), n = out.size(1);
        const std::vector<float> ia = inverse_scales(a, m, trans_a ? 1 : 0),
                                 ib = inverse_scales(b, n, trans_b ? 0 : 1);
        map_on_host<float, float>(acc, scaled, [&](const float* p, float* q) {
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) q[i * n + j] = p[i * n + j] * ia[i] * ib[j];
        });
    }
    be.copy(scaled, out);  // to out's dtype
}

}  // namespace ptool
