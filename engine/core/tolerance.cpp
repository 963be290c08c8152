#include "core/tolerance.h"

#include <algorithm>
#include <cmath>

namespace ptool {

double frobenius_bound(DType dt, int depth) { return 4.0 * std::pow(1.03, std::max(depth, 1)) * dtype_eps(dt); }

Tolerance Tolerance::for_dtype(DType dt, int depth) {
    switch (dt) {
        case DType::float64: return {1e-7, 1e-7};
        case DType::bfloat16: return {1.6e-2, 1e-5, frobenius_bound(dt, depth)};
        case DType::float16: return {1e-3, 1e-5, frobenius_bound(dt, depth)};
        default: return {1.3e-6, 1e-5};
    }
}

Tolerance Tolerance::with(const Override& o) const {
    Tolerance t = *this;
    if (o.empty()) return t;
    t.rel_fro = 0;  // a tolerance asked for is the rule
    if (o.rtol) t.rtol = *o.rtol;
    if (o.atol) t.atol = *o.atol;
    return t;
}

}  // namespace ptool
