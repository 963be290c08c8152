#include "verify/compare.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "model/batch.h"

namespace ptool {
namespace {

// Maps a float's bits to an integer that is monotone in the float's value (sign-magnitude -> two's complement).
int64_t ordered_bits(float v) {
    int32_t b;
    std::memcpy(&b, &v, 4);
    return b < 0 ? std::numeric_limits<int32_t>::min() - static_cast<int64_t>(b) : b;
}
int64_t ordered_bits(double v) {
    int64_t b;
    std::memcpy(&b, &v, 8);
    return b < 0 ? std::numeric_limits<int64_t>::min() - b : b;
}
template <class Half>  // bf16_t, f16_t: sign and magnitude in 16 bits
    requires requires(Half h) { h.bits; }
int64_t ordered_bits(Half v) {
    const int64_t mag = v.bits & 0x7fff;
    return (v.bits & 0x8000) ? -mag : mag;
}

// |a - b| of two ordered bit patterns, saturating (doubles of opposite sign are more than 2^63 apart).
int64_t ulp_distance(int64_t a, int64_t b) {
    const uint64_t d = a > b ? static_cast<uint64_t>(a) - static_cast<uint64_t>(b) : static_cast<uint64_t>(b) - static_cast<uint64_t>(a);
    return d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(d);
}

// One element of the comparison; the ULP distance only where both tensors have one dtype.
struct Accumulate {
    const Tolerance& tol;
    TensorDiff& d;
    double& err2;  // sum of (a - e)^2
    double& ref2;  // sum of e^2
    void operator()(double a, double e) const {
        if (!std::isfinite(a) || !std::isfinite(e)) {
            ++d.nonfinite;
            if ((std::isnan(a) && std::isnan(e)) || a == e) return;  // the same NaN or infinity at the same place
            const double bad = std::isnan(a) || std::isnan(e) ? std::numeric_limits<double>::quiet_NaN()
                                                              : std::numeric_limits<double>::infinity();
            if (!std::isnan(d.max_abs)) d.max_abs = d.max_rel = d.headroom = bad;
            d.pass = false;
            return;
        }
        const double abs_err = std::abs(a - e);
        err2 += abs_err * abs_err;
        ref2 += e * e;
        d.max_abs = std::max(d.max_abs, abs_err);
        if (e != 0) d.max_rel = std::max(d.max_rel, abs_err / std::abs(e));
        else if (abs_err > 0) d.max_rel = std::numeric_limits<double>::infinity();
        const double bound = tol.atol + tol.rtol * std::abs(e);
        d.headroom = std::max(d.headroom, bound > 0 ? abs_err / bound : (abs_err > 0 ? 1e300 : 0.0));
    }
};

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

namespace {

// One range of a same-dtype float comparison: its part of the maxima and of the two sums.
struct Part {
    TensorDiff d;
    double err2 = 0, ref2 = 0;
};

Part compare_range(const Tensor& actual, const Tensor& expected, const Tolerance& tol, bool equal_bytes, int64_t begin,
                   int64_t end) {
    Part part;
    const Accumulate acc{tol, part.d, part.err2, part.ref2};
    const bool frobenius = tol.rel_fro > 0 || tol.systematic > 0;  // else a bitwise-equal tensor's norm is not needed
    dispatch_float(actual.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T *pa = actual.data<T>(), *pe = expected.data<T>();
        if (equal_bytes) {  // bitwise equal: only NaN can fail
            for (int64_t i = begin; i < end; ++i) {
                const double v = static_cast<acc_t<T>>(pa[i]);
                if (!std::isfinite(v)) acc(v, v);
                else if (frobenius) part.ref2 += v * v;  // the norm a module's tensors are judged by
            }
            return;
        }
        for (int64_t i = begin; i < end; ++i) {
            acc(static_cast<acc_t<T>>(pa[i]), static_cast<acc_t<T>>(pe[i]));
            part.d.max_ulp = std::max(part.d.max_ulp, ulp_distance(ordered_bits(pa[i]), ordered_bits(pe[i])));
        }
    });
    return part;
}

// Tensors of at least kSplitAt elements are compared in blocks of kBlock on up to 8 threads (rank 0
// compares while the other rank threads sleep in their next collective), and the blocks' sums are
// added in block order: the numbers do not depend on the thread count.
constexpr int64_t kBlock = int64_t{1} << 18, kSplitAt = int64_t{1} << 20;

Part compare_blocks(const Tensor& actual, const Tensor& expected, const Tolerance& tol, bool equal_bytes) {
    const int64_t n = actual.numel();
    if (n < kSplitAt) return compare_range(actual, expected, tol, equal_bytes, 0, n);
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<Part> parts(static_cast<size_t>(blocks));
    std::atomic<int64_t> next{0};
    auto work = [&] {
        for (int64_t b; (b = next.fetch_add(1)) < blocks;)
            parts[b] = compare_range(actual, expected, tol, equal_bytes, b * kBlock, std::min(n, (b + 1) * kBlock));
    };
    const int threads = static_cast<int>(std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::min<int64_t>(8, blocks)));
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
    work();
    for (auto& h : helpers) h.join();
    Part all;
    for (const Part& p : parts) {
        all.err2 += p.err2, all.ref2 += p.ref2;
        auto worst = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b); };
        all.d.max_abs = worst(all.d.max_abs, p.d.max_abs);
        all.d.max_rel = worst(all.d.max_rel, p.d.max_rel);
        all.d.headroom = worst(all.d.headroom, p.d.headroom);
        all.d.max_ulp = std::max(all.d.max_ulp, p.d.max_ulp);
        all.d.nonfinite += p.d.nonfinite;
        all.d.pass = all.d.pass && p.d.pass;
    }
    return all;
}

}  // namespace

TensorDiff compare_tensors(const Tensor& actual, const Tensor& expected, const Tolerance& tol) {
    TensorDiff d;
    if (actual.shape() != expected.shape()) {
        d.shape_ok = d.pass = false;
        d.headroom = std::numeric_limits<double>::infinity();
        return d;
    }
    double err2 = 0, ref2 = 0;
    const int64_t n = actual.numel();
    if (actual.dtype() == expected.dtype() && dtype_is_float(actual.dtype())) {
        // in place in the tensors' own dtype (no double copies: 134M-element gradients are compared
        // as they are), in blocks on several threads when large
        const bool equal_bytes = std::memcmp(actual.raw(), expected.raw(), actual.nbytes()) == 0;
        const Part p = compare_blocks(actual, expected, tol, equal_bytes);
        d = p.d, err2 = p.err2, ref2 = p.ref2;
    } else {  // mixed dtypes or integers: through doubles, no ULP distance across dtypes
        const Accumulate acc{tol, d, err2, ref2};
        const std::vector<double> av = as_doubles(actual), ev = as_doubles(expected);
        const bool same_dtype = actual.dtype() == expected.dtype();
        for (int64_t i = 0; i < n; ++i) {
            acc(av[i], ev[i]);
            if (same_dtype) d.max_ulp = std::max(d.max_ulp, static_cast<int64_t>(std::abs(av[i] - ev[i])));
        }
    }
    d.err_norm = std::isfinite(d.max_abs) ? std::sqrt(err2) : std::numeric_limits<double>::infinity();
    d.ref_norm = std::sqrt(ref2);
    d.rel_fro = d.ref_norm > 0 ? d.err_norm / d.ref_norm : (d.err_norm > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    const bool elementwise = d.pass && d.headroom <= 1.0;
    d.by_frobenius = !elementwise && d.pass && tol.rel_fro > 0 && d.rel_fro <= tol.rel_fro;
    d.pass = elementwise || d.by_frobenius;
    return d;
}

uint64_t tensor_digest(const Tensor& t) {
    auto mix = [](uint64_t h, uint64_t w) {
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        return h ^ (h >> 31);
    };
    uint64_t h = 0x9E3779B97F4A7C15ull;
    h = mix(h, static_cast<uint64_t>(t.dtype()));
    for (int64_t d : t.shape()) h = mix(h, static_cast<uint64_t>(d));
    // four independent lanes over 32-byte strides (one multiply chain was the digest's bound)
    const auto* p = static_cast<const unsigned char*>(t.raw());
    const size_t n = t.nbytes();
    uint64_t lane[4] = {h, h ^ 1, h ^ 2, h ^ 3};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
            uint64_t w;
            std::memcpy(&w, p + i + 8 * k, 8);
            lane[k] = mix(lane[k], w);
        }
    for (; i < n; ++i) lane[0] = (lane[0] ^ p[i]) * 0x94D049BB133111EBull;
    for (int k = 0; k < 4; ++k) h = mix(h, lane[k]);
    return h ^ (h >> 29);
}

Tolerance rule_for(const Tolerance& tol, const std::string& key) {
    if (!tol.masters) return tol;
    const auto k = parse_step_key(key);
    return k && k->kind() == "param" ? tol.for_masters() : tol;
}

}  // namespace ptool
