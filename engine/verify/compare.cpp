#include "verify/compare.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/cores.h"
#include "model/batch.h"
#include "verify/signed_sums.h"
#include "verify/spans.h"

namespace ptool {
namespace {

// Maps a float's bits to an integer that is monotone in the float's value: the magnitude, negated
// for a negative sign (branch-free: the signs of compared gradients are random).
int64_t ordered_bits(float v) {
    int32_t b;
    std::memcpy(&b, &v, 4);
    const int64_t mag = b & 0x7fffffff, neg = b >> 31;  // neg: 0 or -1
    return (mag ^ neg) - neg;
}
int64_t ordered_bits(double v) {
    int64_t b;
    std::memcpy(&b, &v, 8);
    const int64_t mag = b & std::numeric_limits<int64_t>::max(), neg = b >> 63;
    return (mag ^ neg) - neg;
}
template <class Half>  // bf16_t, f16_t: sign and magnitude in 16 bits
requires requires(Half h) {
    h.bits;
}
int64_t ordered_bits(Half v) {
    const int64_t mag = v.bits & 0x7fff;
    return (v.bits & 0x8000) ? -mag : mag;
}

// |a - b| of two ordered bit patterns, saturating (doubles of opposite sign are more than 2^63 apart).
int64_t ulp_distance(int64_t a, int64_t b) {
    const uint64_t d = a > b ? static_cast<uint64_t>(a) - static_cast<uint64_t>(b)
                             : static_cast<uint64_t>(b) - static_cast<uint64_t>(a);
    return d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(d);
}

// One element of the comparison; the ULP distance only where both tensors have one dtype.
struct Accumulate {
    const Tolerance& tol;
    DiffPiece& p;
    void operator()(double a, double e) const {
        TensorDiff& d = p.d;
        if (!std::isfinite(a) || !std::isfinite(e)) {
            ++d.nonfinite;
            d.nonfinite_actual += !std::isfinite(a), d.nonfinite_expected += !std::isfinite(e);
            if ((std::isnan(a) && std::isnan(e)) || a == e)
                return;  // the same NaN or infinity at the same place
            const double bad = std::isnan(a) || std::isnan(e) ? std::numeric_limits<double>::quiet_NaN()
                                                              : std::numeric_limits<double>::infinity();
            if (!std::isnan(d.max_abs)) d.max_abs = d.max_rel = d.headroom = bad;
            d.pass = false;
            return;
        }
        const double abs_err = std::abs(a - e);
        p.err2.add(abs_err * abs_err);
        p.ref2.add(e * e);
        d.max_abs = std::max(d.max_abs, abs_err);
        if (e != 0)
            d.max_rel = std::max(d.max_rel, abs_err / std::abs(e));
        else if (abs_err > 0)
            d.max_rel = std::numeric_limits<double>::infinity();
        const double bound = tol.atol + tol.rtol * std::abs(e);
        d.headroom = std::max(d.headroom, bound > 0 ? abs_err / bound : (abs_err > 0 ? 1e300 : 0.0));
    }
};

// Division-free tests that an error cannot raise a running maximum m of err / den: when
// err < fl(fl(m (1 - 2^-50)) den), and that product is a normal finite double, then err / den < m
// exactly, so its rounded quotient is at most m (rounding is monotone and m is a double). Only the
// elements that pass the gate are divided, so the maxima are bitwise those of dividing every one.
struct MaxGate {
    static constexpr double kTiny = 0x1p-1000;  // the product is normal beyond it
    double gate = 0;
    static double of(double m) { return m * (1.0 - 0x1p-50); }
    bool below(double err, double den) const {
        const double p = gate * den;
        return err < p && p > kTiny && p < std::numeric_limits<double>::infinity();
    }
};

constexpr int64_t kChunk = 64;  // elements compared at a time

// A chunk's terms of a BinnedSum, made four at a time by the vector paths
struct BinTerms {
    int64_t bin[kChunk], add[kChunk];
    void add_to(BinnedSum& sum, int64_t n) const {  // the first n terms, unflushed (add_unflushed's)
        for (int64_t k = 0; k < n; ++k) sum.bin[bin[k]] += static_cast<uint64_t>(add[k]);
    }
};

// The common case of a float32 chunk that differs, four elements at a time (AVX2, where the CPU
// has it): every element finite and none able to raise max_rel or headroom (the MaxGates' tests,
// in the same arithmetic, as the element loop makes them). Writes the squares the exact sums take
// (err2, ref2) and raises max |a - e| and the ULP distance; false: the chunk takes the element
// loop, which computes it again from the start (as does a chunk whose length is not a multiple of
// four, and every chunk on a CPU without AVX2).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Four floats' bits as int64 lanes monotone in the values (ordered_bits)
__attribute__((target("avx2"))) inline __m256i ordered4(const float* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), neg = _mm_srai_epi32(b, 31);
    return _mm256_cvtepi32_epi64(
        _mm_sub_epi32(_mm_xor_si128(_mm_and_si128(b, _mm_set1_epi32(0x7fffffff)), neg), neg));
}

// A BinnedSum's terms of four non-negative doubles: their bins (biased exponents) and the integers
// added there (BinnedSum::add_unflushed's), stored at bin[0..3] and add[0..3].
__attribute__((target("avx2"))) inline void binned4(__m256d v, int64_t* bin, int64_t* add) {
    const __m256i bits = _mm256_castpd_si256(v), e = _mm256_srli_epi64(bits, 52);
    const __m256i hidden = _mm256_andnot_si256(_mm256_cmpeq_epi64(e, _mm256_setzero_si256()),
                                               _mm256_set1_epi64x(int64_t{1} << 52));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bin), e);
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(add),
        _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x((int64_t{1} << 52) - 1)), hidden));
}

__attribute__((target("avx2"))) bool differ_fast_avx2(const float* a, const float* e, int64_t n,
                                                      const MaxGate& rel_gate, const MaxGate& head_gate,
                                                      const Tolerance& tol, BinTerms& err2, BinTerms& ref2,
                                                      double& max_abs, int64_t& max_ulp) {
    const __m256d sign = _mm256_set1_pd(-0.0), inf = _mm256_set1_pd(std::numeric_limits<double>::infinity()),
                  tiny = _mm256_set1_pd(MaxGate::kTiny), zero = _mm256_setzero_pd();
    const __m256d rel = _mm256_set1_pd(rel_gate.gate), head = _mm256_set1_pd(head_gate.gate),
                  atol = _mm256_set1_pd(tol.atol), rtol = _mm256_set1_pd(tol.rtol);
    __m256d mabs = _mm256_set1_pd(max_abs), ok = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
    __m256i mulp = _mm256_set1_epi64x(max_ulp);
    for (int64_t i = 0; i + 4 <= n; i += 4) {
        const __m256d av = _mm256_cvtps_pd(_mm_loadu_ps(a + i)), ev = _mm256_cvtps_pd(_mm_loadu_ps(e + i));
        const __m256d abs_err = _mm256_andnot_pd(sign, _mm256_sub_pd(av, ev)),
                      mag = _mm256_andnot_pd(sign, ev);
        binned4(_mm256_mul_pd(abs_err, abs_err), err2.bin + i, err2.add + i);
        binned4(_mm256_mul_pd(ev, ev), ref2.bin + i, ref2.add + i);
        mabs = _mm256_max_pd(mabs, abs_err);  // NaN-free wherever the chunk passes
        const __m256i u = _mm256_sub_epi64(ordered4(a + i), ordered4(e + i));
        const __m256i neg = _mm256_cmpgt_epi64(_mm256_setzero_si256(), u);
        const __m256i au = _mm256_sub_epi64(_mm256_xor_si256(u, neg), neg);
        mulp = _mm256_blendv_epi8(mulp, au, _mm256_cmpgt_epi64(au, mulp));
        const __m256d finite = _mm256_and_pd(_mm256_cmp_pd(_mm256_andnot_pd(sign, av), inf, _CMP_LT_OQ),
                                             _mm256_cmp_pd(mag, inf, _CMP_LT_OQ));
        const __m256d pr = _mm256_mul_pd(rel, mag);
        const __m256d below = _mm256_and_pd(
            _mm256_cmp_pd(abs_err, pr, _CMP_LT_OQ),
            _mm256_and_pd(_mm256_cmp_pd(pr, tiny, _CMP_GT_OQ), _mm256_cmp_pd(pr, inf, _CMP_LT_OQ)));
        const __m256d nonzero = _mm256_cmp_pd(ev, zero, _CMP_NEQ_UQ);
        const __m256d rel_ok =
            _mm256_or_pd(_mm256_and_pd(nonzero, below),
                         _mm256_andnot_pd(nonzero, _mm256_cmp_pd(abs_err, zero, _CMP_NGT_UQ)));
        const __m256d bound = _mm256_add_pd(atol, _mm256_mul_pd(rtol, mag)), ph = _mm256_mul_pd(head, bound);
        const __m256d head_ok = _mm256_and_pd(
            _mm256_and_pd(_mm256_cmp_pd(bound, zero, _CMP_GT_OQ), _mm256_cmp_pd(abs_err, ph, _CMP_LT_OQ)),
            _mm256_and_pd(_mm256_cmp_pd(ph, tiny, _CMP_GT_OQ), _mm256_cmp_pd(ph, inf, _CMP_LT_OQ)));
        ok = _mm256_and_pd(ok, _mm256_and_pd(finite, _mm256_and_pd(rel_ok, head_ok)));
    }
    if (_mm256_movemask_pd(ok) != 0xf) return false;
    alignas(32) double m[4];
    alignas(32) int64_t u[4];
    _mm256_store_pd(m, mabs), _mm256_store_si256(reinterpret_cast<__m256i*>(u), mulp);
    for (int k = 0; k < 4; ++k) max_abs = std::max(max_abs, m[k]), max_ulp = std::max(max_ulp, u[k]);
    return true;
}
// A float32 chunk that is bitwise equal to its expected one, every element finite: the terms of
// the sum of squares; false (nothing to use) where an element is not finite.
__attribute__((target("avx2"))) bool equal_fast_avx2(const float* a, int64_t n, BinTerms& ref2) {
    const __m128i exponent = _mm_set1_epi32(0x7f800000);
    __m128i nonfinite = _mm_setzero_si128();
    for (int64_t i = 0; i + 4 <= n; i += 4) {
        const __m128 v = _mm_loadu_ps(a + i);
        nonfinite =
            _mm_or_si128(nonfinite, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(v), exponent), exponent));
        const __m256d d = _mm256_cvtps_pd(v);
        binned4(_mm256_mul_pd(d, d), ref2.bin + i, ref2.add + i);
    }
    return _mm_testz_si128(nonfinite, nonfinite);
}
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
#endif

bool differ_fast(const float* a, const float* e, int64_t n, const MaxGate& rel, const MaxGate& head,
                 const Tolerance& tol, BinTerms& err2, BinTerms& ref2, double& max_abs, int64_t& max_ulp) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return kHaveAvx2 && n % 4 == 0 && differ_fast_avx2(a, e, n, rel, head, tol, err2, ref2, max_abs, max_ulp);
#else
    return false;
#endif
}

bool equal_fast(const float* a, int64_t n, BinTerms& ref2) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return kHaveAvx2 && n % 4 == 0 && equal_fast_avx2(a, n, ref2);
#else
    return false;
#endif
}

// One batch of spans of a same-dtype float comparison, a chunk of kChunk elements at a time. A
// chunk bitwise equal to its expected one adds only |e|^2 (an equal element can raise no maximum;
// the parameters after a step that agrees are nearly all bitwise equal). Other chunks take the
// fast path for finite elements (Accumulate's arithmetic, its divisions gated, the exact sums
// binned); non-finite ones go through Accumulate.
void compare_spans(const Tensor& actual, const Tensor& expected, const Tolerance& tol, const Span* begin,
                   const Span* end, DiffPiece& part) {
    const Accumulate acc{tol, part};
    // at most one term each per element: flushed every kFlushEvery elements
    const BinnedSum::Window window =
        dtype_size(actual.dtype()) < 8 ? BinnedSum::kFloatSquares : BinnedSum::kAll;
    BinnedSum err2(window), ref2(window);
    BinTerms e2, r2;  // a float32 chunk's terms, made by the vector paths
    int64_t since_flush = 0;
    bool err_terms = false;  // err2 has terms since its last flush
    auto count = [&](int64_t n) {
        if ((since_flush += n) <= BinnedSum::kFlushEvery - kChunk) return;
        if (err_terms) err2.flush(), err_terms = false;
        ref2.flush(), since_flush = 0;
    };
    dispatch_float(actual.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T *pa = actual.data<T>(), *pe = expected.data<T>();
        TensorDiff& d = part.d;
        MaxGate rel{MaxGate::of(d.max_rel)}, head{MaxGate::of(d.headroom)};
        auto equal = [&](const T* a, int64_t n) {  // bitwise equal: only NaN can fail
            for (int64_t i = 0; i < n; ++i) {
                const double v = static_cast<acc_t<T>>(a[i]);
                if (!std::isfinite(v))
                    acc(v, v);
                else
                    ref2.add_unflushed(v * v);
            }
        };
        auto differ = [&](const T* a, const T* e, int64_t n) {
            // the maxima in registers, written back around the non-finite path (Accumulate's)
            double max_abs = d.max_abs, max_rel = d.max_rel, headroom = d.headroom;
            int64_t max_ulp = d.max_ulp;
            for (int64_t i = 0; i < n; ++i) {
                const double av = static_cast<acc_t<T>>(a[i]), ev = static_cast<acc_t<T>>(e[i]);
                if constexpr (sizeof(T) < 8)  // ordered bits within +-2^31: no saturation
                    max_ulp = std::max(max_ulp, std::abs(ordered_bits(a[i]) - ordered_bits(e[i])));
                else
                    max_ulp = std::max(max_ulp, ulp_distance(ordered_bits(a[i]), ordered_bits(e[i])));
                if (!std::isfinite(av) || !std::isfinite(ev)) [[unlikely]] {
                    d.max_abs = max_abs, d.max_rel = max_rel, d.headroom = headroom;
                    acc(av, ev);
                    max_abs = d.max_abs, max_rel = d.max_rel, headroom = d.headroom;
                    rel.gate = MaxGate::of(max_rel), head.gate = MaxGate::of(headroom);
                    continue;
                }
                const double abs_err = std::abs(av - ev), mag = std::abs(ev);
                err2.add_unflushed(abs_err * abs_err);
                ref2.add_unflushed(ev * ev);
                max_abs = std::max(max_abs, abs_err);
                if (ev != 0) {
                    if (!rel.below(abs_err, mag)) [[unlikely]]
                        max_rel = std::max(max_rel, abs_err / mag), rel.gate = MaxGate::of(max_rel);
                } else if (abs_err > 0) {
                    max_rel = std::numeric_limits<double>::infinity(), rel.gate = MaxGate::of(max_rel);
                }
                const double bound = tol.atol + tol.rtol * mag;
                if (!(bound > 0) || !head.below(abs_err, bound)) [[unlikely]] {
                    headroom = std::max(headroom, bound > 0 ? abs_err / bound : (abs_err > 0 ? 1e300 : 0.0));
                    head.gate = MaxGate::of(headroom);
                }
            }
            d.max_abs = max_abs, d.max_rel = max_rel, d.headroom = headroom, d.max_ulp = max_ulp;
        };
        for (const Span* s = begin; s != end; ++s)
            for (int64_t i = 0; i < s->n; i += kChunk) {
                const T *a = pa + s->a + i, *e = pe + s->e + i;
                const int64_t n = std::min(kChunk, s->n - i);
                if (std::memcmp(a, e, static_cast<size_t>(n) * sizeof(T)) == 0) {
                    if constexpr (std::is_same_v<T, float>) {
                        if (equal_fast(a, n, r2)) {
                            r2.add_to(ref2, n);
                            count(n);
                            continue;
                        }
                    }
                    equal(a, n);
                } else {
                    part.all_equal = false, err_terms = true;
                    if constexpr (std::is_same_v<T, float>) {
                        if (differ_fast(a, e, n, rel, head, tol, e2, r2, d.max_abs, d.max_ulp)) {
                            e2.add_to(err2, n), r2.add_to(ref2, n);
                            count(n);
                            continue;
                        }
                    }
                    differ(a, e, n);
                }
                count(n);
            }
    });
    part.err2.add(err2.sum()), part.ref2.add(ref2.sum());
}

double worst(double a, double b) {
    return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
}

// Pieces of at least kSplitAt elements are compared in batches of about kBlock elements on up to
// `threads` threads (a rank comparing while the other rank threads wait); the sums are exact, so
// nothing depends on the thread count or the order.
constexpr int64_t kBlock = int64_t{1} << 18, kSplitAt = int64_t{1} << 20;

}  // namespace

void ExactSum::normalize() {
    constexpr uint64_t mask = (uint64_t{1} << kDigit) - 1;
    for (int i = 0; i + 1 < kWords; ++i) w[i + 1] += w[i] >> kDigit, w[i] &= mask;
    pending = 0;
}

void BinnedSum::flush() {
    // bin e holds mantissas whose lowest bit is 2^(e - 1075), or 2^-1074 for subnormals (e = 0);
    // a term's bins are few, so groups of eight empty ones are skipped at once
    for (int g = lo; g < hi; g += 8) {
        uint64_t any = 0;
        for (int e = g; e < g + 8; ++e) any |= bin[e];
        if (!any) continue;
        for (int e = g; e < g + 8; ++e)
            if (bin[e]) total.add_scaled(bin[e], static_cast<unsigned>(e - (e != 0))), bin[e] = 0;
    }
    count = 0;
}

void ExactSum::add(const ExactSum& o) {
    ExactSum b = o;
    b.normalize(), normalize();
    for (int i = 0; i < kWords; ++i) w[i] += b.w[i];
    normalize();
}

double ExactSum::value() const {
    ExactSum n = *this;
    n.normalize();
    double r = 0;
    for (int i = kWords - 1; i >= 0; --i)
        if (n.w[i]) r += std::ldexp(static_cast<double>(n.w[i]), kDigit * i - 1074);
    return r;
}

int compare_threads() {
    return static_cast<int>(std::clamp(usable_cores(), 1, 8));
}

namespace {

// The spans' elements compared (compare_piece's maxima, counts and Frobenius sums)
DiffPiece compare_spans_of(const Tensor& actual, const Tensor& expected, const std::vector<Span>& spans,
                           const Tolerance& tol, int threads) {
    DiffPiece piece;
    piece.counted = true;
    const int64_t n = actual.numel();
    if (actual.dtype() != expected.dtype() || !dtype_is_float(actual.dtype())) {
        // mixed dtypes or integers: through doubles, no ULP distance across dtypes
        const Accumulate acc{tol, piece};
        const bool same_dtype = actual.dtype() == expected.dtype();
        for (const Span& s : spans)
            for (int64_t i = 0; i < s.n; ++i) {
                const double a = actual.item(s.a + i), e = expected.item(s.e + i);
                if (a != e || std::memcmp(&a, &e, 8) != 0) piece.all_equal = false;
                acc(a, e);
                if (same_dtype)
                    piece.d.max_ulp = std::max(piece.d.max_ulp, static_cast<int64_t>(std::abs(a - e)));
            }
        return piece;
    }
    // in place in the tensors' own dtype (no double copies: 134M-element gradients are compared as
    // they are), in batches on several threads when large
    if (threads <= 1 || n < kSplitAt) {
        compare_spans(actual, expected, tol, spans.data(), spans.data() + spans.size(), piece);
        return piece;
    }
    std::vector<std::pair<size_t, size_t>> batches;  // [first, last) spans of about kBlock elements
    std::vector<Span> cut;                           // long spans cut to kBlock
    for (const Span& s : spans)
        for (int64_t i = 0; i < s.n; i += kBlock)
            cut.push_back({s.a + i, s.e + i, std::min(kBlock, s.n - i)});
    for (size_t i = 0; i < cut.size();) {
        size_t j = i;
        for (int64_t elems = 0; j < cut.size() && elems < kBlock; ++j) elems += cut[j].n;
        batches.emplace_back(i, j), i = j;
    }
    std::vector<DiffPiece> parts(batches.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t b; (b = next.fetch_add(1)) < batches.size();)
            compare_spans(actual, expected, tol, cut.data() + batches[b].first,
                          cut.data() + batches[b].second, parts[b]);
    };
    const int helpers_n = static_cast<int>(std::min<int64_t>(threads, static_cast<int64_t>(batches.size())));
    std::vector<std::thread> helpers;
    for (int t = 1; t < helpers_n; ++t) helpers.emplace_back(work);
    work();
    for (auto& h : helpers) h.join();
    for (DiffPiece& p : parts) p.counted = true, merge_piece(piece, p);
    return piece;
}

}  // namespace

DiffPiece compare_piece(const Tensor& actual, const Tensor& expected, const std::vector<int64_t>& offset,
                        const Tolerance& tol, int threads) {
    DiffPiece piece;
    piece.counted = true;
    const Shape &local = actual.shape(), &global = expected.shape();
    bool fits = local.size() == global.size() && offset.size() == local.size();
    for (size_t d = 0; fits && d < local.size(); ++d)
        fits = offset[d] >= 0 && offset[d] + local[d] <= global[d];
    if (!fits) {
        piece.d.shape_ok = piece.d.pass = false;
        piece.d.headroom = std::numeric_limits<double>::infinity();
        return piece;
    }
    const std::vector<Span> spans = spans_of(local, global, offset);
    piece = compare_spans_of(actual, expected, spans, tol, threads);
    piece.d.elements = actual.numel();
    add_signed_sums(actual, expected, spans, tol, piece);
    return piece;
}

void merge_piece(DiffPiece& into, const DiffPiece& p) {
    if (!p.counted) return;
    into.counted = true;
    into.err2.add(p.err2), into.ref2.add(p.ref2);
    into.over.add(p.over), into.under.add(p.under), into.magnitude.add(p.magnitude);
    into.along.add(p.along), into.against.add(p.against);
    into.projected = into.projected || p.projected;
    into.all_equal = into.all_equal && p.all_equal;
    TensorDiff& a = into.d;
    const TensorDiff& b = p.d;
    a.max_abs = worst(a.max_abs, b.max_abs);
    a.max_rel = worst(a.max_rel, b.max_rel);
    a.headroom = worst(a.headroom, b.headroom);
    a.max_ulp = std::max(a.max_ulp, b.max_ulp);
    a.elements += b.elements;
    a.nonfinite += b.nonfinite;
    a.nonfinite_actual += b.nonfinite_actual, a.nonfinite_expected += b.nonfinite_expected;
    a.pass = a.pass && b.pass;
    a.shape_ok = a.shape_ok && b.shape_ok;
}

TensorDiff finish_diff(const DiffPiece& all, const Tolerance& tol) {
    TensorDiff d = all.d;
    if (!d.shape_ok) {
        d.pass = false;
        d.headroom = std::numeric_limits<double>::infinity();
        return d;
    }
    // a bitwise-equal tensor's norm only where a Frobenius rule reads it
    const bool frobenius = tol.rel_fro > 0 || tol.systematic > 0;
    d.err_norm =
        std::isfinite(d.max_abs) ? std::sqrt(all.err2.value()) : std::numeric_limits<double>::infinity();
    d.ref_norm = all.all_equal && !frobenius ? 0.0 : std::sqrt(all.ref2.value());
    d.rel_fro = d.ref_norm > 0 ? d.err_norm / d.ref_norm
                               : (d.err_norm > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    d.signed_err = all.over.value() - all.under.value();
    d.expected_l1 = all.magnitude.value();
    if (all.projected) {
        const double ref2 = all.ref2.value();
        d.projected = true;
        d.projection = ref2 > 0 ? (all.along.value() - all.against.value()) / ref2 : 0.0;
    }
    const bool elementwise = d.pass && d.headroom <= 1.0;
    d.by_frobenius = !elementwise && d.pass && tol.rel_fro > 0 && d.rel_fro <= tol.rel_fro;
    d.pass = elementwise || d.by_frobenius;
    return d;
}

void pack_piece(const DiffPiece& piece, int64_t* out) {
    DiffPiece p = piece;
    p.err2.normalize(), p.ref2.normalize(), p.over.normalize(), p.under.normalize(), p.magnitude.normalize();
    p.along.normalize(), p.against.normalize();
    auto bits = [](double v) {
        int64_t b;
        std::memcpy(&b, &v, 8);
        return b;
    };
    out[0] = p.counted, out[1] = p.all_equal, out[2] = p.d.shape_ok, out[3] = p.d.pass,
    out[4] = p.d.nonfinite;
    out[5] = p.d.max_ulp, out[6] = bits(p.d.max_abs), out[7] = bits(p.d.max_rel), out[8] = bits(p.d.headroom);
    out[9] = p.d.nonfinite_actual, out[10] = p.d.nonfinite_expected, out[11] = p.d.elements;
    for (int i = 0; i < ExactSum::kWords; ++i) {
        out[12 + i] = static_cast<int64_t>(p.err2.w[i]);
        out[12 + ExactSum::kWords + i] = static_cast<int64_t>(p.ref2.w[i]);
        out[12 + 2 * ExactSum::kWords + i] = static_cast<int64_t>(p.over.w[i]);
        out[12 + 3 * ExactSum::kWords + i] = static_cast<int64_t>(p.under.w[i]);
        out[12 + 4 * ExactSum::kWords + i] = static_cast<int64_t>(p.magnitude.w[i]);
        out[12 + 5 * ExactSum::kWords + i] = static_cast<int64_t>(p.along.w[i]);
        out[12 + 6 * ExactSum::kWords + i] = static_cast<int64_t>(p.against.w[i]);
    }
    out[12 + 7 * ExactSum::kWords] = p.projected;
}

DiffPiece unpack_piece(const int64_t* in) {
    auto value = [](int64_t b) {
        double v;
        std::memcpy(&v, &b, 8);
        return v;
    };
    DiffPiece p;
    p.counted = in[0], p.all_equal = in[1], p.d.shape_ok = in[2], p.d.pass = in[3], p.d.nonfinite = in[4];
    p.d.max_ulp = in[5], p.d.max_abs = value(in[6]), p.d.max_rel = value(in[7]), p.d.headroom = value(in[8]);
    p.d.nonfinite_actual = in[9], p.d.nonfinite_expected = in[10], p.d.elements = in[11];
    for (int i = 0; i < ExactSum::kWords; ++i) {
        p.err2.w[i] = static_cast<uint64_t>(in[12 + i]);
        p.ref2.w[i] = static_cast<uint64_t>(in[12 + ExactSum::kWords + i]);
        p.over.w[i] = static_cast<uint64_t>(in[12 + 2 * ExactSum::kWords + i]);
        p.under.w[i] = static_cast<uint64_t>(in[12 + 3 * ExactSum::kWords + i]);
        p.magnitude.w[i] = static_cast<uint64_t>(in[12 + 4 * ExactSum::kWords + i]);
        p.along.w[i] = static_cast<uint64_t>(in[12 + 5 * ExactSum::kWords + i]);
        p.against.w[i] = static_cast<uint64_t>(in[12 + 6 * ExactSum::kWords + i]);
    }
    p.projected = in[12 + 7 * ExactSum::kWords];
    return p;
}

TensorDiff compare_tensors(const Tensor& actual, const Tensor& expected, const Tolerance& tol) {
    if (actual.shape() != expected.shape()) {
        TensorDiff d;
        d.shape_ok = d.pass = false;
        d.headroom = std::numeric_limits<double>::infinity();
        return d;
    }
    return finish_diff(compare_piece(actual, expected, std::vector<int64_t>(actual.shape().size(), 0), tol,
                                     compare_threads()),
                       tol);
}

Tolerance rule_for(const Tolerance& tol, const std::string& key) {
    const auto k = parse_step_key(key);
    if (tol.loss_of_outputs != Tolerance::OutputSum::none && k && k->kind() == "output") {
        Tolerance t = tol;
        t.signed_sum = true;
        return t;
    }
    if (tol.clip_max_norm > 0 && k && (k->kind() == "grad" || k->kind() == "grad_norm")) {
        Tolerance t = tol;
        (k->kind() == "grad" ? t.projected : t.signed_sum) = true;
        return t;
    }
    if (!tol.masters) return tol;
    return k && k->kind() == "param" ? tol.for_masters() : tol;
}

}  // namespace ptool
