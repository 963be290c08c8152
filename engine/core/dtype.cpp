#include "core/dtype.h"

#include <cmath>

namespace ptool {

size_t dtype_size(DType dt) {
    switch (dt) {
        case DType::float32:
            return 4;
        case DType::float64:
            return 8;
        case DType::bfloat16:
            return 2;
        case DType::float16:
            return 2;
        case DType::int64:
            return 8;
        case DType::int32:
            return 4;
        case DType::uint8:
            return 1;
    }
    return 0;
}

const char* dtype_name(DType dt) {
    switch (dt) {
        case DType::float32:
            return "float32";
        case DType::float64:
            return "float64";
        case DType::bfloat16:
            return "bfloat16";
        case DType::float16:
            return "float16";
        case DType::int64:
            return "int64";
        case DType::int32:
            return "int32";
        case DType::uint8:
            return "uint8";
    }
    return "?";
}

const char* dtype_safetensors_name(DType dt) {
    switch (dt) {
        case DType::float32:
            return "F32";
        case DType::float64:
            return "F64";
        case DType::bfloat16:
            return "BF16";
        case DType::float16:
            return "F16";
        case DType::int64:
            return "I64";
        case DType::int32:
            return "I32";
        case DType::uint8:
            return "U8";
    }
    return "?";
}

double dtype_eps(DType dt) {
    switch (dt) {
        case DType::float64:
            return 0x1p-52;
        case DType::bfloat16:
            return 0x1p-7;
        case DType::float16:
            return 0x1p-10;
        default:
            return 0x1p-23;
    }
}

bool dtype_is_float(DType dt) {
    return dt != DType::int64 && dt != DType::int32 && dt != DType::uint8;
}

DType parse_dtype(const std::string& name) {
    for (DType dt : {DType::float32, DType::float64, DType::bfloat16, DType::float16})
        if (name == dtype_name(dt)) return dt;
    throw InputError(fmt::format("unknown dtype '{}' (valid: float32, bfloat16, float16, float64)", name));
}

bool parse_safetensors_dtype(const std::string& name, DType* out) {
    for (DType dt :
         {DType::float32, DType::float64, DType::bfloat16, DType::float16, DType::int64, DType::int32}) {
        if (name == dtype_safetensors_name(dt)) {
            *out = dt;
            return true;
        }
    }
    return false;
}

// IEEE 754 binary16 conversions, round-to-nearest-even, subnormals and inf/NaN preserved.
float half_to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = std::ldexp(static_cast<float>(man), -24);
        if (sign) f = -f;
        return f;
    }
    uint32_t u;
    if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t float_to_half(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return sign | 0x7e00u;   // NaN
    if (au >= 0x477ff000u) return sign | 0x7c00u;  // overflow (>= 65520 rounds to inf)
    if (au < 0x38800000u) {                        // subnormal or zero in half
        float a;
        std::memcpy(&a, &au, 4);
        float scaled = a * 16777216.0f;  // 2^24: one unit = smallest subnormal
        return sign | static_cast<uint16_t>(std::nearbyint(scaled));
    }
    uint32_t rounded = au + 0xfffu + ((au >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

}  // namespace ptool
