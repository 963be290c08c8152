// Element types and the 16-bit float storage types.
//
// bfloat16 and float16 are storage formats: kernels load them as float, compute and accumulate
// in float, and round once on store (round-to-nearest-even), as PyTorch's CPU kernels do.
// float64 computes in double. Integer types hold token and class ids only; uint8 holds raw bytes
// (float8 codes: FSDP2's float8 all-gather moves a float8 weight as uint8, parallel/fully_shard.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace ptool {

enum class DType { float32, float64, bfloat16, float16, int64, int32, uint8 };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);              // "float32", as the model YAML spells it
const char* dtype_safetensors_name(DType dt);  // "F32", as safetensors headers spell it
bool dtype_is_float(DType dt);
double dtype_eps(DType dt);                  // torch.finfo(dtype).eps (floating dtypes)
DType parse_dtype(const std::string& name);  // throws InputError naming the valid choices
bool parse_safetensors_dtype(const std::string& name, DType* out);

struct bf16_t {
    uint16_t bits = 0;
    bf16_t() = default;
    bf16_t(float f) {  // NOLINT: implicit, so templated kernels store floats into it
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
        } else {
            u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
            bits = static_cast<uint16_t>(u >> 16);
        }
    }
    operator float() const {  // NOLINT
        uint32_t u = static_cast<uint32_t>(bits) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

struct f16_t {
    uint16_t bits = 0;
    f16_t() = default;
    f16_t(float f) : bits(float_to_half(f)) {}              // NOLINT
    operator float() const { return half_to_float(bits); }  // NOLINT
};

// The type arithmetic is done in: double for double, float for everything else.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// acc_t's dtype: where kernels keep row statistics (norms' mean and rstd, a softmax's max and sum)
// for tensors of dtype dt.
constexpr DType acc_dtype(DType dt) {
    return dt == DType::float64 ? DType::float64 : DType::float32;
}

template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, float>) return DType::float32;
    if constexpr (std::is_same_v<T, double>) return DType::float64;
    if constexpr (std::is_same_v<T, bf16_t>) return DType::bfloat16;
    if constexpr (std::is_same_v<T, f16_t>) return DType::float16;
    if constexpr (std::is_same_v<T, int64_t>) return DType::int64;
    if constexpr (std::is_same_v<T, int32_t>) return DType::int32;
    if constexpr (std::is_same_v<T, uint8_t>) return DType::uint8;
}

// Calls f(T{}) with T the C++ storage type of a floating dtype.
template <class F>
decltype(auto) dispatch_float(DType dt, F&& f) {
    switch (dt) {
        case DType::float32:
            return f(float{});
        case DType::float64:
            return f(double{});
        case DType::bfloat16:
            return f(bf16_t{});
        case DType::float16:
            return f(f16_t{});
        default:
            break;
    }
    PTOOL_REQUIRE(false, "dtype {} is not a floating type", dtype_name(dt));
    return f(float{});
}

}  // namespace ptool
