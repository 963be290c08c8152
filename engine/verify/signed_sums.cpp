#include "verify/signed_sums.h"

#include <cmath>
#include <memory>

namespace ptool {
namespace {

// The five sums, binned (exact) while the elements are walked
struct SignedBins {
    BinnedSum over, under, magnitude, along, against;
};

}  // namespace

void add_signed_sums(const Tensor& actual, const Tensor& expected, const std::vector<Span>& spans,
                     const Tolerance& tol, DiffPiece& p) {
    if (!tol.signed_sum && !tol.projected) return;
    auto bins = std::make_unique<SignedBins>();  // 80 KiB: not on a rank thread's stack
    const bool sign = tol.signed_sum, project = tol.projected;
    auto add = [&](double e, double a) {  // (a and e as doubles, whatever the tensors' dtype)
        const double d = a - e;
        if (sign && std::isfinite(d)) {
            if (d > 0) bins->over.add(d);
            if (d < 0) bins->under.add(-d);
            bins->magnitude.add(std::abs(e));  // finite where d is
        }
        if (const double x = e * d; project && std::isfinite(x)) {
            if (x > 0) bins->along.add(x);
            if (x < 0) bins->against.add(-x);
        }
    };
    if (actual.dtype() == expected.dtype() && dtype_is_float(actual.dtype()) &&
        actual.device() == Device::cpu && expected.device() == Device::cpu) {
        dispatch_float(actual.dtype(), [&](auto tag) {  // the tensors as they are (a gradient: millions)
            using T = decltype(tag);
            const T *pa = actual.data<T>(), *pe = expected.data<T>();
            for (const Span& s : spans)
                for (int64_t i = 0; i < s.n; ++i)
                    add(static_cast<acc_t<T>>(pe[s.e + i]), static_cast<acc_t<T>>(pa[s.a + i]));
        });
    } else {
        for (const Span& s : spans)
            for (int64_t i = 0; i < s.n; ++i) add(expected.item(s.e + i), actual.item(s.a + i));
    }
    if (sign)
        p.over.add(bins->over.sum()), p.under.add(bins->under.sum()), p.magnitude.add(bins->magnitude.sum());
    if (project) p.projected = true, p.along.add(bins->along.sum()), p.against.add(bins->against.sum());
}

}  // namespace ptool
