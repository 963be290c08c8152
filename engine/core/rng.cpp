#include "core/rng.h"

#include <cmath>

namespace ptool {

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

namespace {
// uniform(index) without the object's remembered block: the runs below leave the object untouched,
// so threads may draw runs of one shared CounterRng at once
double uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
    const std::array<uint32_t, 4> r = philox4x32(seed, stream, index >> 1);
    return (index & 1) ? to_unit(r[2], r[3]) : to_unit(r[0], r[1]);
}
}  // namespace

void CounterRng::uniform_run(uint64_t first, int64_t n, double* out) const {
    int64_t i = 0;
    for (; i < n && ((first + i) & 1); ++i)
        out[i] = uniform_at(seed_, stream_, first + i);  // to an even index
    std::array<uint32_t, 4> blocks[16];
    for (; i + 32 <= n; i += 32) {
        philox4x32_x16(seed_, stream_, (first + i) >> 1, blocks);
        for (int k = 0; k < 16; ++k) {
            out[i + 2 * k] = to_unit(blocks[k][0], blocks[k][1]);
            out[i + 2 * k + 1] = to_unit(blocks[k][2], blocks[k][3]);
        }
    }
    for (; i < n; ++i) out[i] = uniform_at(seed_, stream_, first + i);
}

namespace {
double box_muller(const std::array<uint32_t, 4>& r) {
    const double u1 = 1.0 - to_unit(r[0], r[1]);  // (0, 1]: log is finite
    const double u2 = to_unit(r[2], r[3]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}
}  // namespace

double CounterRng::normal(uint64_t index) const {
    return box_muller(philox4x32(seed_, stream_, index));
}

void CounterRng::normal_run(uint64_t first, int64_t n, double* out) const {
    int64_t i = 0;
    std::array<uint32_t, 4> blocks[16];
    for (; i + 16 <= n; i += 16) {
        philox4x32_x16(seed_, stream_, first + i, blocks);
        for (int k = 0; k < 16; ++k) out[i + k] = box_muller(blocks[k]);
    }
    for (; i < n; ++i) out[i] = normal(first + i);
}

uint64_t CounterRng::below(uint64_t index, uint64_t n) const {
    return static_cast<uint64_t>(uniform(index) * static_cast<double>(n)) % n;
}

}  // namespace ptool
