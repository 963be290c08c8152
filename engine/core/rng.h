// Counter-based RNG: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//
// Every random value is a pure function of (seed, stream, index): value = f(seed, stream, index).
// A rank holding a shard of a tensor draws exactly the numbers the full tensor holds at those
// indices, with no communication and no sequential state. Streams name what is drawn
// (stream_id("init", "net1.weight"), stream_id("dropout", fqn, step)).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

// The generator's arithmetic is also the CUDA backend's (backend/cuda/cuda_init_draw.cu draws
// uniform values on the device bitwise the host's): these inline functions compile for both.
#ifdef __CUDACC__
#define PTOOL_HOST_DEVICE __host__ __device__
#else
#define PTOOL_HOST_DEVICE
#endif

namespace ptool {

// Philox4x32-10's constants and one round on a counter (c0, c1, c2, c3) under key (k0, k1); the
// scalar and the 16-lane generator share it.
namespace philox {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
PTOOL_HOST_DEVICE inline void round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0,
                                    uint32_t k1) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0, c2 = n2;
}
}  // namespace philox

// Inline: initialisation draws one block per two elements of every parameter (8.4M for gemm_mlp).
PTOOL_HOST_DEVICE inline std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi,
                                                            uint64_t counter_lo) {
    uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
    uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int r = 0; r < 10; ++r, k0 += philox::kW0, k1 += philox::kW1) philox::round(c0, c1, c2, c3, k0, k1);
    return {c0, c1, c2, c3};
}

// 64-bit FNV-1a of the parts, separated so ("ab","c") != ("a","bc").
uint64_t stream_id(std::string_view a, std::string_view b = {}, uint64_t c = 0);

// Philox blocks for counters (counter_hi, lo + k), k < 16, computed lane by lane so the compiler
// vectorises the rounds: out[k] is philox4x32(key, counter_hi, lo + k) (tested equal).
inline void philox4x32_x16(uint64_t key, uint64_t counter_hi, uint64_t lo, std::array<uint32_t, 4>* out) {
    constexpr int kLanes = 16;
    uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    for (int k = 0; k < kLanes; ++k) {
        const uint64_t ctr = lo + static_cast<uint64_t>(k);
        c0[k] = static_cast<uint32_t>(ctr), c1[k] = static_cast<uint32_t>(ctr >> 32);
        c2[k] = static_cast<uint32_t>(counter_hi), c3[k] = static_cast<uint32_t>(counter_hi >> 32);
    }
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int r = 0; r < 10; ++r, k0 += philox::kW0, k1 += philox::kW1)
        for (int k = 0; k < kLanes; ++k) philox::round(c0[k], c1[k], c2[k], c3[k], k0, k1);
    for (int k = 0; k < kLanes; ++k) out[k] = {c0[k], c1[k], c2[k], c3[k]};
}

// 53 bits of two Philox words as a double in [0, 1).
PTOOL_HOST_DEVICE inline double to_unit(uint32_t hi, uint32_t lo) {
    const uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
    return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// A value drawn by index is the same however it is reached; the object remembers its last Philox
// block so that consecutive uniform indices 2k, 2k+1 cost one block (it is per thread, not shared).
class CounterRng {
public:
    CounterRng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

    // U[0, 1), 53 bits; indices 2k and 2k+1 share a Philox block (words 0-1 the even, 2-3 the odd)
    double uniform(uint64_t index) const {
        if ((index >> 1) != last_block_) {  // never equal at first: a block index is below 2^63
            last_ = philox4x32(seed_, stream_, index >> 1);
            last_block_ = index >> 1;
        }
        return (index & 1) ? to_unit(last_[2], last_[3]) : to_unit(last_[0], last_[1]);
    }
    // out[i] = uniform(first + i) for i < n, 16 blocks at a time (init of a whole tensor); the runs
    // (uniform_run, normal_run) read nothing the object remembers: threads may share one object
    void uniform_run(uint64_t first, int64_t n, double* out) const;
    double normal(uint64_t index) const;  // N(0, 1), Box-Muller on one Philox block (counter = index)
    void normal_run(uint64_t first, int64_t n,
                    double* out) const;                // out[i] = normal(first + i), 16 blocks at a time
    uint64_t below(uint64_t index, uint64_t n) const;  // uniform integer in [0, n)
    uint64_t seed() const { return seed_; }
    uint64_t stream() const { return stream_; }

private:
    uint64_t seed_;
    uint64_t stream_;
    mutable uint64_t last_block_ = ~uint64_t{0};
    mutable std::array<uint32_t, 4> last_{};
};

}  // namespace ptool
