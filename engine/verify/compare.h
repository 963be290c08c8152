// Tensor comparison with torch.testing.assert_close's rule (core/tolerance.h): |a - e| <= atol +
// rtol * |e|, NaN never equal (equal_nan=False). Also reports the ULP distance in the tensors'
// dtype, the headroom (the worst |a - e| / (atol + rtol * |e|); < 1 passes) and the Frobenius
// norms the low-precision rule and the module rule (verify/report.cpp) judge by.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/tolerance.h"

namespace ptool {

struct TensorDiff {
    bool shape_ok = true;
    // Elements where either side is NaN or infinite. They agree only where both hold the same
    // (NaN and NaN, or the same infinity) at the same place; elsewhere the tensor fails and its
    // errors read nan (a NaN against a number) or inf. That is a file compared with itself (golden
    // diff); a verify's verdicts fail any tensor with one (verify/report.h: fail_nonfinite).
    int64_t nonfinite = 0;
    int64_t nonfinite_actual = 0, nonfinite_expected = 0;  // of each side
    double max_abs = 0, max_rel = 0, headroom = 0;
    double rel_fro = 0;  // ||a - e||_F / ||e||_F (inf when e is zero and a is not)
    double err_norm = 0,
           ref_norm = 0;  // ||a - e||_F and ||e||_F (ref_norm 0 for bitwise-equal tensors without rel_fro)
    bool by_frobenius = false;    // failed the elementwise rule, passed by the Frobenius bound
    bool systematic = false;      // a gradient whose every element passed but whose error is beyond rounding
                                  // (Tolerance::systematic, judged against its module's in verify/report.cpp)
    bool systematic_own = false;  // ... against its own norm (a gradient small beside its module's): rel_fro
                                  // is of its own norm, not its module's
    bool by_gradients = false;  // a parameter that failed the elementwise rule while its gradients agreed and
                                // its update is the optimizer's on them (verify/report.h, update rule)
    int64_t max_ulp = 0;
    double signed_err = 0;   // sum of a - e, exact (Tolerance::signed_sum; 0 otherwise)
    double expected_l1 = 0;  // sum of |e|, exact (the same)
    // Tolerance::projected: <a - e, e> / ||e||^2, the scale s that makes a closest to (1 + s) e (a
    // gradient clip_grad_norm scaled by another factor than the reference's: s is that factor less
    // 1, and ||a - (1 + s) e|| what is left); 0 otherwise
    double projection = 0;
    bool projected = false;
    int64_t elements = 0;  // compared (over every piece: each element once)
    bool pass = true;
};

TensorDiff compare_tensors(const Tensor& actual, const Tensor& expected, const Tolerance& tol);

// An exact, order-independent sum of non-negative doubles (a fixed-point accumulator over every
// double's exponent range): the Frobenius sums of a tensor compared in pieces, on several ranks,
// read exactly what comparing it whole reads.
struct ExactSum {
    // 52-bit digits of a fixed-point number whose lowest bit is 2^-1074, each word with 12 bits of
    // room for carries that are propagated every 4095 additions (no branch per element).
    static constexpr int kWords = 43;
    static constexpr int kDigit = 52;
    uint64_t w[kWords] = {};
    int pending = 0;      // additions since the carries were last propagated
    void add(double v) {  // v >= 0, finite; branch-free (a zero adds zero digits)
        uint64_t bits;
        std::memcpy(&bits, &v, 8);
        const int biased = static_cast<int>(bits >> 52);  // v >= 0: no sign bit
        const uint64_t mant = (bits & ((uint64_t{1} << 52) - 1)) | (static_cast<uint64_t>(biased != 0) << 52);
        const unsigned pos =
            static_cast<unsigned>(biased - (biased != 0));  // the mantissa's lowest bit is 2^(pos - 1074)
        const unsigned i = pos / kDigit, sh = pos % kDigit;
        constexpr uint64_t mask = (uint64_t{1} << kDigit) - 1;
        w[i] += (mant << sh) & mask;
        w[i + 1] += (mant >> (kDigit - sh - 1)) >> 1;  // two shifts: sh = 0 shifts by 52 in all
        if (++pending == 4095) normalize();
    }
    // v * 2^(pos - 1074) for any 64-bit v: up to three words (pos <= 2046, the largest finite exponent's)
    void add_scaled(uint64_t v, unsigned pos) {
        const unsigned i = pos / kDigit, sh = pos % kDigit;
        constexpr uint64_t mask = (uint64_t{1} << kDigit) - 1;
        const unsigned __int128 x = static_cast<unsigned __int128>(v) << sh;
        w[i] += static_cast<uint64_t>(x) & mask;
        w[i + 1] += static_cast<uint64_t>(x >> kDigit) & mask;
        w[i + 2] += static_cast<uint64_t>(x >> (2 * kDigit));
        if (++pending == 4095) normalize();
    }
    void add(const ExactSum& o);
    void normalize();      // propagates the carries: every word < 2^52
    double value() const;  // the same for the same sum, whatever the order of the terms
};

// The same exact sum, faster for many terms: a term's 53-bit mantissa is added to the integer bin
// of its exponent (one add, no shifts), and the bins are moved into the ExactSum every 2048 terms
// (before a bin can overflow: 2048 * 2^53 = 2^64) and at the end. 16 KiB of bins. A flush scans
// the bins [lo, hi): every bin a term can reach (BinnedSum(kFloatSquares) where every term is the
// square of a float32 value or of a difference of two: scanning 2048 bins every 2048 terms was a
// fifth of comparing two float32 tensors).
struct BinnedSum {
    static constexpr int kBins = 2048;  // the biased exponents of finite doubles (0..2046), and one spare
    static constexpr int kFlushEvery = 2048;
    // A float32 value (bf16, f16: within its range) is a multiple of 2^-149 below 2^128, so is the
    // exact difference of two; their squares, rounded to double, lie in [2^-298, 2^258]
    struct Window {
        int lo, hi;
    };
    static constexpr Window kAll{0, kBins}, kFloatSquares{1023 - 298, 1023 + 258 + 1};
    explicit BinnedSum(Window w = kAll) : lo(w.lo / 8 * 8), hi(w.hi) {}
    uint64_t bin[kBins] = {};
    int count = 0;
    int lo, hi;  // the bins a term can reach; lo a multiple of 8
    ExactSum total;
    void add(double v) {  // v >= 0, finite
        add_unflushed(v);
        if (++count == kFlushEvery) flush();
    }
    // add without counting: the caller flushes at least every kFlushEvery terms (a hot loop keeps
    // one count in a register for several sums)
    void add_unflushed(double v) {
        uint64_t bits;
        std::memcpy(&bits, &v, 8);
        const uint64_t e = bits >> 52;  // no sign bit
        bin[e] += (bits & ((uint64_t{1} << 52) - 1)) | (static_cast<uint64_t>(e != 0) << 52);
    }
    void flush();  // the bins into total
    const ExactSum& sum() {
        flush();
        return total;
    }
};

// A piece of a comparison: one rank's elements of a tensor, its maxima, counts and exact sums.
// compare_tensors is compare_piece over the whole tensor, then finish_diff.
struct DiffPiece {
    TensorDiff d;
    ExactSum err2, ref2;
    // Tolerance::signed_sum: the sums of a - e where positive, of e - a where positive, and of |e|
    ExactSum over, under, magnitude;
    // Tolerance::projected: the sums of e (a - e) where positive and of -e (a - e) where positive
    ExactSum along, against;
    bool projected = false;
    bool counted = false;   // this piece holds elements (a replica that does not count holds none)
    bool all_equal = true;  // every element bitwise equal to its expected one
};
// `actual` against the box of `expected` that starts at `offset` (one entry per dim) and has
// actual's shape; a large piece is compared on up to `threads` threads (the calling one and
// helpers; 1: the calling thread only). The numbers do not depend on it.
DiffPiece compare_piece(const Tensor& actual, const Tensor& expected, const std::vector<int64_t>& offset,
                        const Tolerance& tol, int threads);
int compare_threads();  // the most a comparison takes: one per core, at most 8
void merge_piece(DiffPiece& into, const DiffPiece& piece);  // the maxima, counts and sums of both
TensorDiff finish_diff(const DiffPiece& all, const Tolerance& tol);
// A piece as int64 words (for a collective) and back.
constexpr int kPieceWords = 13 + 7 * ExactSum::kWords;  // sums packed normalized
void pack_piece(const DiffPiece& p, int64_t* out);
DiffPiece unpack_piece(const int64_t* in);

// The rule for a recorded tensor: the masters' (Tolerance::masters) for step{k}.param.*; a model
// output's with signed_sum where the loss is of the outputs themselves (Tolerance::loss_of_outputs);
// a gradient's `projected` and the grad_norm's signed_sum where the model clips
// (Tolerance::clip_max_norm); else tol.
Tolerance rule_for(const Tolerance& tol, const std::string& key);

}  // namespace ptool
