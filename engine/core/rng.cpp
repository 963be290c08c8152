#include "core/rng.h"

#include <cmath>

namespace ptool {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
    constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
    uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
    uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
        uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
        uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
        uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = static_cast<uint32_t>(p1);
        uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = static_cast<uint32_t>(p0);
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += kW0, k1 += kW1;
    }
    return {c0, c1, c2, c3};
}

uint64_t stream_id(std::string_view a, std::string_view b, uint64_t c) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](unsigned char byte) {
        h ^= byte;
        h *= 1099511628211ull;
    };
    for (char ch : a) mix(static_cast<unsigned char>(ch));
    mix(0xff);
    for (char ch : b) mix(static_cast<unsigned char>(ch));
    mix(0xfe);
    for (int i = 0; i < 8; ++i) mix(static_cast<unsigned char>(c >> (8 * i)));
    return h;
}

static double to_unit(uint32_t hi, uint32_t lo) {
    uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);  // 53 bits
    return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// One Philox block (128 bits) serves two consecutive indices: words 0-1 the even, 2-3 the odd.
double CounterRng::uniform(uint64_t index) const {
    auto r = philox4x32(seed_, stream_, index >> 1);
    return (index & 1) ? to_unit(r[2], r[3]) : to_unit(r[0], r[1]);
}

double CounterRng::normal(uint64_t index) const {
    auto r = philox4x32(seed_, stream_, index);
    double u1 = 1.0 - to_unit(r[0], r[1]);  // (0, 1]: log is finite
    double u2 = to_unit(r[2], r[3]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t CounterRng::below(uint64_t index, uint64_t n) const {
    return static_cast<uint64_t>(uniform(index) * static_cast<double>(n)) % n;
}

}  // namespace ptool
