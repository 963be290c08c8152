#include "verify/compare.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ptool {
namespace {

// Maps a float's bits to an integer that is monotone in the float's value (sign-magnitude -> two's complement).
int64_t ordered(const Tensor& t, int64_t i) {
    switch (t.dtype()) {
        case DType::float32: {
            int32_t b;
            std::memcpy(&b, t.data<float>() + i, 4);
            return b < 0 ? std::numeric_limits<int32_t>::min() - static_cast<int64_t>(b) : b;
        }
        case DType::float64: {
            int64_t b;
            std::memcpy(&b, t.data<double>() + i, 8);
            return b < 0 ? std::numeric_limits<int64_t>::min() - b : b;
        }
        case DType::bfloat16:
        case DType::float16: {
            const uint16_t u = t.dtype() == DType::bfloat16 ? t.data<bf16_t>()[i].bits : t.data<f16_t>()[i].bits;
            const int64_t mag = u & 0x7fff;
            return (u & 0x8000) ? -mag : mag;
        }
        default: return static_cast<int64_t>(t.item(i));
    }
}

std::vector<double> as_doubles(const Tensor& t) {
    if (!dtype_is_float(t.dtype())) return t.to_doubles();
    std::vector<double> out(t.numel());
    dispatch_float(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* p = t.data<T>();
        for (int64_t i = 0, n = t.numel(); i < n; ++i) out[i] = static_cast<double>(static_cast<acc_t<T>>(p[i]));
    });
    return out;
}

}  // namespace

Tolerance default_tolerance(DType dt) {
    switch (dt) {
        case DType::float64: return {1e-7, 1e-7};
        case DType::bfloat16: return {1.6e-2, 1e-5};
        case DType::float16: return {1e-3, 1e-5};
        default: return {1.3e-6, 1e-5};
    }
}

TensorDiff compare_tensors(const Tensor& actual, const Tensor& expected, const Tolerance& tol) {
    TensorDiff d;
    if (actual.shape() != expected.shape()) {
        d.shape_ok = d.pass = false;
        d.headroom = std::numeric_limits<double>::infinity();
        return d;
    }
    const bool same_dtype = actual.dtype() == expected.dtype();
    const std::vector<double> av = as_doubles(actual), ev = as_doubles(expected);
    for (int64_t i = 0, n = actual.numel(); i < n; ++i) {
        const double a = av[i], e = ev[i];
        if (std::isnan(a) || std::isnan(e) || std::isinf(a) != std::isinf(e) || (std::isinf(a) && a != e)) {
            d.max_abs = d.max_rel = d.headroom = std::numeric_limits<double>::infinity();
            d.pass = false;
            continue;
        }
        const double abs_err = std::isinf(a) ? 0.0 : std::abs(a - e);
        d.max_abs = std::max(d.max_abs, abs_err);
        if (e != 0) d.max_rel = std::max(d.max_rel, abs_err / std::abs(e));
        else if (abs_err > 0) d.max_rel = std::numeric_limits<double>::infinity();
        const double bound = tol.atol + tol.rtol * std::abs(e);
        d.headroom = std::max(d.headroom, bound > 0 ? abs_err / bound : (abs_err > 0 ? 1e300 : 0.0));
        if (same_dtype) d.max_ulp = std::max(d.max_ulp, std::abs(ordered(actual, i) - ordered(expected, i)));
    }
    d.pass = d.pass && d.headroom <= 1.0;
    return d;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace ptool
