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

namespace ptool {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// 64-bit FNV-1a of the parts, separated so ("ab","c") != ("a","bc").
uint64_t stream_id(std::string_view a, std::string_view b = {}, uint64_t c = 0);

class CounterRng {
public:
    CounterRng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

    double uniform(uint64_t index) const;  // U[0, 1), 53 bits; indices 2k and 2k+1 share a Philox block
    double normal(uint64_t index) const;   // N(0, 1), Box-Muller on one Philox block (counter = index)
    uint64_t below(uint64_t index, uint64_t n) const;  // uniform integer in [0, n)

private:
    uint64_t seed_;
    uint64_t stream_;
};

}  // namespace ptool
