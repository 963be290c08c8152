// core/float8.h against c10's own conversions (c10/util/Float8_e4m3fn.h, Float8_e5m2.h: the bit
// algorithms PyTorch's `.to(torch.float8_*)` runs, written out below as the oracle, since Debian's
// PyTorch 1.13 has no float8 dtype): every code's value, every code's round trip, a million float32
// inputs across every exponent and the midpoints around every value; torchao's saturated cast and
// tensorwise scale.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/float8.h"
#include "model/float8_gemm.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_float8 {

namespace {

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// c10's fp8e4m3fn_from_fp32_value
uint8_t c10_e4m3fn(float f) {
    constexpr uint32_t fp8_max = UINT32_C(1087) << 20, denorm_mask = UINT32_C(141) << 23;
    uint32_t f_bits = bits_of(f);
    uint8_t result = 0u;
    const uint32_t sign = f_bits & UINT32_C(0x80000000);
    f_bits ^= sign;
    if (f_bits >= fp8_max) {
        result = 0x7f;
    } else if (f_bits < (UINT32_C(121) << 23)) {
        f_bits = bits_of(from_bits(f_bits) + from_bits(denorm_mask));
        result = static_cast<uint8_t>(f_bits - denorm_mask);
    } else {
        const uint8_t mant_odd = (f_bits >> 20) & 1;
        f_bits += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFF;
        f_bits += mant_odd;
        result = static_cast<uint8_t>(f_bits >> 20);
    }
    return static_cast<uint8_t>(result | (sign >> 24));
}

// c10's fp8e5m2_from_fp32_value
uint8_t c10_e5m2(float f) {
    constexpr uint32_t fp32_inf = UINT32_C(255) << 23, fp8_max = UINT32_C(143) << 23,
                       denorm_mask = UINT32_C(134) << 23;
    uint32_t f_bits = bits_of(f);
    uint8_t result = 0u;
    const uint32_t sign = f_bits & UINT32_C(0x80000000);
    f_bits ^= sign;
    if (f_bits >= fp8_max) {
        result = f_bits > fp32_inf ? UINT8_C(0x7F) : UINT8_C(0x7C);
    } else if (f_bits < (UINT32_C(113) << 23)) {
        f_bits = bits_of(from_bits(f_bits) + from_bits(denorm_mask));
        result = static_cast<uint8_t>(f_bits - denorm_mask);
    } else {
        const uint32_t mant_odd = (f_bits >> 21) & 1;
        f_bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFFF;
        f_bits += mant_odd;
        result = static_cast<uint8_t>(f_bits >> 21);
    }
    return static_cast<uint8_t>(result | (sign >> 24));
}

uint8_t c10(float f, Float8Format k) {
    return k == Float8Format::e4m3fn ? c10_e4m3fn(f) : c10_e5m2(f);
}

// NaN codes compare as NaN: c10 keeps the input's sign on a NaN, as float8_encode does
bool same_code(uint8_t a, uint8_t b, Float8Format k) {
    const bool na = std::isnan(float8_decode(a, k)), nb = std::isnan(float8_decode(b, k));
    return na || nb ? na && nb && (a & 0x80) == (b & 0x80) : a == b;
}

const Float8Format kFormats[] = {Float8Format::e4m3fn, Float8Format::e5m2};

}  // namespace

TEST_CASE("float8: every code's value, and its round trip", "[cpu][float8]") {
    CHECK(float8_decode(0x7E, Float8Format::e4m3fn) == 448.0f);
    CHECK(std::isnan(float8_decode(0x7F, Float8Format::e4m3fn)));
    CHECK(float8_decode(0x08, Float8Format::e4m3fn) == 0x1p-6f);  // smallest normal
    CHECK(float8_decode(0x01, Float8Format::e4m3fn) == 0x1p-9f);  // smallest subnormal
    CHECK(float8_decode(0x38, Float8Format::e4m3fn) == 1.0f);
    CHECK(float8_decode(0x7B, Float8Format::e5m2) == 57344.0f);
    CHECK(float8_decode(0x7C, Float8Format::e5m2) == std::numeric_limits<float>::infinity());
    CHECK(float8_decode(0xFC, Float8Format::e5m2) == -std::numeric_limits<float>::infinity());
    for (uint8_t c : {0x7D, 0x7E, 0x7F}) CHECK(std::isnan(float8_decode(c, Float8Format::e5m2)));
    CHECK(float8_decode(0x01, Float8Format::e5m2) == 0x1p-16f);
    CHECK(float8_decode(0x3C, Float8Format::e5m2) == 1.0f);
    for (Float8Format k : kFormats) {
        const Float8Info& in = float8_info(k);
        CHECK(float8_decode(0x80, k) == 0.0f);
        CHECK(std::signbit(float8_decode(0x80, k)));
        int finite = 0;
        for (int c = 0; c < 256; ++c) {
            const uint8_t code = static_cast<uint8_t>(c);
            const float v = float8_decode(code, k);
            INFO(in.name << " code " << c << " = " << v);
            CHECK(same_code(float8_encode(v, k), code, k));
            CHECK(same_code(c10(v, k), code, k));
            if (!std::isfinite(v)) continue;
            ++finite;
            CHECK(std::fabs(v) <= in.max);
        }
        CHECK(finite == (k == Float8Format::e4m3fn ? 254 : 248));
    }
}

TEST_CASE("float8: the cast is c10's, bit for bit, over a million float32 inputs", "[cpu][float8]") {
    for (Float8Format k : kFormats) {
        INFO(float8_info(k).name);
        int64_t checked = 0, mismatched = 0;
        auto one = [&](float x) {
            ++checked;
            if (!same_code(float8_encode(x, k), c10(x, k), k)) {
                if (++mismatched <= 5) FAIL_CHECK("x " << x << " (bits " << bits_of(x) << ")");
            }
        };
        for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4093) one(from_bits(static_cast<uint32_t>(u)));
        // around every value and every midpoint: the values themselves, one float32 ulp either side
        for (int c = 0; c < 128; ++c) {
            const float v = float8_decode(static_cast<uint8_t>(c), k),
                        next = float8_decode(static_cast<uint8_t>(c + 1), k);
            if (!std::isfinite(v)) continue;
            const float mid = std::isfinite(next)
                                  ? (v + next) / 2
                                  : v + (v - float8_decode(static_cast<uint8_t>(c - 1), k)) / 2;
            for (float y : {v, mid})
                for (float z : {std::nextafter(y, 0.0f), y, std::nextafter(y, 1e30f)}) one(z), one(-z);
        }
        one(std::numeric_limits<float>::infinity()), one(-std::numeric_limits<float>::infinity());
        one(std::numeric_limits<float>::quiet_NaN());
        CHECK(checked > 1000000);
        CHECK(mismatched == 0);
    }
}

TEST_CASE("float8: torch's cast leaves the range, torchao's saturates, ties go to even", "[cpu][float8]") {
    const Float8Format e4 = Float8Format::e4m3fn, e5 = Float8Format::e5m2;
    CHECK(float8_decode(float8_encode(460.0f, e4), e4) == 448.0f);
    CHECK(float8_decode(float8_encode(464.0f, e4), e4) == 448.0f);  // the tie: 448's code is even
    CHECK(std::isnan(float8_decode(float8_encode(470.0f, e4), e4)));
    CHECK(float8_round(1e9f, e4) == 448.0f);
    CHECK(float8_round(-1e9f, e4) == -448.0f);
    CHECK(float8_round(std::numeric_limits<float>::infinity(), e4) == 448.0f);
    CHECK(std::isnan(float8_round(std::numeric_limits<float>::quiet_NaN(), e4)));
    CHECK(float8_decode(float8_encode(61440.0f, e5), e5) == std::numeric_limits<float>::infinity());
    CHECK(float8_round(61440.0f, e5) == 57344.0f);
    CHECK(float8_round(1.0625f, e4) == 1.0f);   // between 1 and 1.125: 1's code even
    CHECK(float8_round(1.1875f, e4) == 1.25f);  // between 1.125 and 1.25: 1.25's
    CHECK(float8_round(0x1p-10f, e4) == 0.0f);  // half the smallest subnormal: to zero (even)
    CHECK(float8_round(0x1.8p-10f, e4) == 0x1p-9f);
}

TEST_CASE("float8: torchao's tensorwise scale", "[cpu][float8]") {
    CHECK(float8_tensorwise_scale(2.0, Float8Format::e4m3fn) == 224.0f);
    CHECK(float8_tensorwise_scale(57344.0, Float8Format::e5m2) == 1.0f);
    CHECK(float8_tensorwise_scale(0.0, Float8Format::e4m3fn) == static_cast<float>(448.0 / 1e-12));
    // the largest magnitude lands on the format's largest value
    const float amax = 3.7f, s = float8_tensorwise_scale(amax, Float8Format::e4m3fn);
    CHECK(float8_round(amax * s, Float8Format::e4m3fn) == 448.0f);
}

TEST_CASE("float8: torchao's tensorwise GEMM, emulated", "[cpu][float8]") {
    Backend& be = backend_for(Device::cpu);
    const int64_t m = 5, k = 7, n = 3;
    Tensor x({m, k}, DType::float32), w({n, k}, DType::float32);
    for (int64_t i = 0; i < x.numel(); ++i)
        x.data<float>()[i] = std::sin(0.7f * static_cast<float>(i)) * 3.1f;
    for (int64_t i = 0; i < w.numel(); ++i)
        w.data<float>()[i] = std::cos(1.3f * static_cast<float>(i)) * 0.02f;
    const Float8Operand a = float8_tensorwise(x, Float8Format::e4m3fn, float8_amax(x)),
                        b = float8_tensorwise(w, Float8Format::e4m3fn, float8_amax(w));
    CHECK(a.scale == float8_tensorwise_scale(float8_amax(x), Float8Format::e4m3fn));
    float most = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
        const float v = a.values.data<float>()[i];
        CHECK(float8_round(v, Float8Format::e4m3fn) == v);  // a float8 value, exactly
        CHECK(v == float8_round(x.data<float>()[i] * a.scale, Float8Format::e4m3fn));
        most = std::max(most, std::fabs(v));
    }
    CHECK(most == 448.0f);  // the largest magnitude lands on the format's largest value
    // y = x w^T as a linear computes it: each element the float8 values' dot product (exact
    // products, summed in double here: within float32's rounding of the GEMM's) over both scales
    Tensor y({m, n}, DType::float32);
    float8_gemm(be, a, false, b, true, y);
    const float alpha = (1.0f / a.scale) * (1.0f / b.scale);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double dot = 0, size = 0;
            for (int64_t t = 0; t < k; ++t) {
                const double p = static_cast<double>(a.values.data<float>()[i * k + t]) *
                                 b.values.data<float>()[j * k + t];
                dot += p, size += std::fabs(p);
            }
            CHECK(std::fabs(y.data<float>()[i * n + j] - dot * alpha) <= 1e-6 * size * alpha + 1e-30);
            // and the float8 GEMM stays within the formats' rounding of the float32 one: each
            // operand's elements within 2^-4 relative (e4m3fn's unit roundoff) of x * scale
            double exact = 0, bound = 0;
            for (int64_t t = 0; t < k; ++t) {
                const double p = static_cast<double>(x.data<float>()[i * k + t]) * w.data<float>()[j * k + t];
                exact += p, bound += std::fabs(p) * (2 * 0x1p-4 + 0x1p-8);
            }
            CHECK(std::fabs(y.data<float>()[i * n + j] - exact) <= bound + 1e-12);
        }
    // the output in bfloat16, as a linear's under mixed precision
    Tensor y16({m, n}, DType::bfloat16);
    float8_gemm(be, a, false, b, true, y16);
    const Tensor got = to_dtype(be, y16, DType::float32),
                 want = to_dtype(be, to_dtype(be, y, DType::bfloat16), DType::float32);
    for (int64_t i = 0; i < got.numel(); ++i) CHECK(got.data<float>()[i] == want.data<float>()[i]);
    CHECK(std::isnan(float8_amax(Tensor::scalar(std::nan(""), DType::float32))));
}

}  // namespace test_float8
