#include "core/float8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace ptool {

const Float8Info& float8_info(Float8Format f) {
    static const Float8Info table[] = {
        {Float8Format::e4m3fn, "float8_e4m3fn", 4, 3, 7, 448.0, 0x1p-6, 0x1p-9},
        {Float8Format::e5m2, "float8_e5m2", 5, 2, 15, 57344.0, 0x1p-14, 0x1p-16},
    };
    return table[f == Float8Format::e4m3fn ? 0 : 1];
}

float float8_decode(uint8_t bits, Float8Format f) {
    const Float8Info& in = float8_info(f);
    const bool negative = bits & 0x80;
    const int exponent = (bits >> in.mantissa_bits) & ((1 << in.exponent_bits) - 1),
              mantissa = bits & ((1 << in.mantissa_bits) - 1), top = (1 << in.exponent_bits) - 1;
    float v;
    if (f == Float8Format::e4m3fn && exponent == top && mantissa == (1 << in.mantissa_bits) - 1)
        v = std::numeric_limits<float>::quiet_NaN();
    else if (f == Float8Format::e5m2 && exponent == top)
        v = mantissa == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    else if (exponent == 0)  // subnormal (or zero)
        v = static_cast<float>(std::ldexp(static_cast<double>(mantissa), 1 - in.bias - in.mantissa_bits));
    else
        v = static_cast<float>(std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -in.mantissa_bits),
                                          exponent - in.bias));
    return negative ? -v : v;
}

namespace {

// The non-negative finite values of a format by code, ascending with the code (0 .. the largest).
struct Positives {
    std::array<float, 128> value{};
    int count = 0;
    explicit Positives(Float8Format f) {
        for (int c = 0; c < 128; ++c) {
            const float v = float8_decode(static_cast<uint8_t>(c), f);
            if (!std::isfinite(v)) break;
            value[count++] = v;
        }
    }
};

const Positives& positives(Float8Format f) {
    static const Positives e4m3(Float8Format::e4m3fn), e5m2(Float8Format::e5m2);
    return f == Float8Format::e4m3fn ? e4m3 : e5m2;
}

}  // namespace

uint8_t float8_encode(float x, Float8Format f) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    // NaN: S.1111.111 / S.11111.11; out of range: e4m3fn has no infinity (NaN), e5m2's S.11111.00
    const uint8_t nan = 0x7F, inf = f == Float8Format::e4m3fn ? 0x7F : 0x7C;
    if (std::isnan(x)) return static_cast<uint8_t>(sign | nan);
    const double a = std::fabs(static_cast<double>(x));
    const Positives& p = positives(f);
    const int last = p.count - 1;
    // the step past the largest finite value: values at or beyond its midpoint leave the range
    const double top = p.value[last], step = top - p.value[last - 1], beyond = top + step / 2;
    if (a > beyond || (a == beyond && (last & 1))) return static_cast<uint8_t>(sign | inf);
    if (a >= top) return static_cast<uint8_t>(sign | last);
    // the nearest value, ties to the even code
    const int hi =
        static_cast<int>(std::upper_bound(p.value.begin(), p.value.begin() + p.count, a) - p.value.begin());
    const int lo = hi - 1;  // p.value[lo] <= a < p.value[hi]
    const double below = a - p.value[lo], above = p.value[hi] - a;
    const int code = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
    return static_cast<uint8_t>(sign | code);
}

uint8_t float8_encode_saturated(float x, Float8Format f) {
    if (std::isnan(x)) return float8_encode(x, f);
    const float m = static_cast<float>(float8_info(f).max);
    return float8_encode(std::clamp(x, -m, m), f);
}

float float8_round(float x, Float8Format f) {
    return float8_decode(float8_encode_saturated(x, f), f);
}

float float8_tensorwise_scale(double amax, Float8Format f) {
    return static_cast<float>(float8_info(f).max / std::max(amax, 1e-12));
}

float float8_power_of_2(float scale) {
    return std::exp2(std::floor(std::log2(scale)));  // the float overloads, as torch's float32 ops
}

}  // namespace ptool
