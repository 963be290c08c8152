#include "core/tolerance.h"

#include <algorithm>
#include <cmath>

namespace ptool {

double frobenius_bound(DType dt, int depth) {
    return 4.0 * std::pow(1.03, std::max(depth, 1)) * dtype_eps(dt);
}

Tolerance Tolerance::for_dtype(DType dt, int depth) {
    switch (dt) {
        case DType::float64:
            return {1e-7, 1e-7, 0, 1024 * dtype_eps(dt), std::nullopt};
        case DType::bfloat16:
            return {1.6e-2, 1e-5, frobenius_bound(dt, depth), 0, std::nullopt};
        case DType::float16:
            return {1e-3, 1e-5, frobenius_bound(dt, depth), 0, std::nullopt};
        default:
            return {1.3e-6, 1e-5, 0, 1024 * dtype_eps(DType::float32), std::nullopt};
    }
}

Tolerance Tolerance::for_policy(DType master, DType compute, int depth) {
    if (dtype_eps(compute) <= dtype_eps(master)) return for_dtype(master, depth);
    Tolerance t = for_dtype(compute, depth);
    const Tolerance m = for_dtype(master, depth);
    t.masters = Pair{m.rtol, m.atol};
    return t;
}

Tolerance Tolerance::for_masters() const {
    if (!masters) return *this;
    return {masters->rtol, masters->atol, 0, 0, std::nullopt};
}

Tolerance Tolerance::with(const Override& o) const {
    Tolerance t = *this;
    // asking for what is already the rule (a golden recorded with the defaults) changes nothing
    const bool same = (!o.rtol || *o.rtol == rtol) && (!o.atol || *o.atol == atol) &&
                      (!o.rel_fro || *o.rel_fro == rel_fro) &&
                      (!o.master_rtol || (masters && *o.master_rtol == masters->rtol)) &&
                      (!o.master_atol || (masters && *o.master_atol == masters->atol));
    if (o.empty() || same) return t;
    t.rel_fro = o.rel_fro ? *o.rel_fro : 0;  // a tolerance asked for is the rule
    t.systematic = 0;
    if (o.rtol) t.rtol = *o.rtol;
    if (o.atol) t.atol = *o.atol;
    if (t.masters) {
        if (o.master_rtol || o.rtol) t.masters->rtol = o.master_rtol ? *o.master_rtol : *o.rtol;
        if (o.master_atol || o.atol) t.masters->atol = o.master_atol ? *o.master_atol : *o.atol;
    }
    return t;
}

}  // namespace ptool
