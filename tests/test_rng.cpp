#include <cmath>
#include <vector>

#include "core/rng.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_rng {

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[cpu]") {
    // kat_vectors: philox4x32 10 rounds, counter 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8
    auto r = philox4x32(0, 0, 0);
    CHECK(r[0] == 0x6627e8d5u);
    CHECK(r[1] == 0xe169c58du);
    CHECK(r[2] == 0xbc57ac4cu);
    CHECK(r[3] == 0x9b00dbd8u);
    // counter all ones, key all ones -> 408f276d 41c83b0e a20bc7c6 6d5451fd
    auto s = philox4x32(~0ull, ~0ull, ~0ull);
    CHECK(s[0] == 0x408f276du);
    CHECK(s[1] == 0x41c83b0eu);
    CHECK(s[2] == 0xa20bc7c6u);
    CHECK(s[3] == 0x6d5451fdu);
    // counter 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0 (digits of pi)
    auto p = philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
    CHECK(p[0] == 0xd16cfe09u);
    CHECK(p[1] == 0x94fdccebu);
    CHECK(p[2] == 0x5001e420u);
    CHECK(p[3] == 0x24126ea1u);
}

TEST_CASE("a value depends on (seed, stream, index) only: shards draw their own slice", "[cpu]") {
    CounterRng a(7, stream_id("init", "net1.weight"));
    CounterRng b(7, stream_id("init", "net1.weight"));
    CHECK(a.normal(12345) == b.normal(12345));
    CHECK(a.normal(1) != a.normal(2));
    CHECK(CounterRng(8, stream_id("init", "net1.weight")).normal(3) != a.normal(3));
    CHECK(stream_id("ab", "c") != stream_id("a", "bc"));
}

TEST_CASE("normal draws have mean 0 and variance 1, uniform draws cover 0 (included) to 1 (excluded)",
          "[cpu]") {
    CounterRng rng(1, 2);
    const int n = 200000;
    double sum = 0, sq = 0, umin = 1, umax = 0;
    for (int i = 0; i < n; ++i) {
        double v = rng.normal(i);
        sum += v, sq += v * v;
        double u = rng.uniform(i + n);
        umin = std::min(umin, u), umax = std::max(umax, u);
    }
    CHECK(std::abs(sum / n) < 0.01);
    CHECK(std::abs(sq / n - 1.0) < 0.02);
    CHECK(umin >= 0.0);
    CHECK(umax < 1.0);
    CHECK(umax > 0.999);
}

TEST_CASE("normal_run draws exactly normal(i), from any first index and length", "[cpu]") {
    const CounterRng rng(5, stream_id("data", "input"));
    for (uint64_t first : {uint64_t{0}, uint64_t{3}, uint64_t{0xFFFFFFF5ull}})
        for (int64_t n : {0, 1, 15, 16, 17, 100, 256, 257, 600}) {  // 256 a chunk of its loops
            std::vector<double> out(static_cast<size_t>(n) + 1, -7.0);
            rng.normal_run(first, n, out.data());
            for (int64_t i = 0; i < n; ++i) CHECK(out[i] == rng.normal(first + i));
            CHECK(out[n] == -7.0);  // nothing written past n
        }
}

TEST_CASE("the vectorised paths draw exactly the scalar values", "[cpu]") {
    // 16 lanes against the scalar Philox, across a carry of the low counter word into the high one
    for (uint64_t lo : {uint64_t{0}, uint64_t{0xFFFFFFF8ull}, ~uint64_t{0} - 7}) {
        std::array<uint32_t, 4> lanes[16];
        philox4x32_x16(0x299f31d0a4093822ull, 0x0370734413198a2eull, lo, lanes);
        for (int k = 0; k < 16; ++k)
            CHECK(lanes[k] == philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, lo + k));
    }
    // a run from any start and of any length (odd starts, tails) equals uniform() index by index,
    // and uniform()'s one-block memo gives the same value in any access order
    const CounterRng rng(3, stream_id("init", "net1.weight"));
    std::vector<double> run(200);
    for (uint64_t first : {0, 1, 31, 64, 1000001}) {
        for (int64_t n : {0, 1, 2, 33, 200}) {
            rng.uniform_run(first, n, run.data());
            for (int64_t i = 0; i < n; ++i) {
                const CounterRng fresh(3, stream_id("init", "net1.weight"));
                REQUIRE(run[i] == fresh.uniform(first + i));
            }
        }
    }
    CHECK(rng.uniform(7) == CounterRng(3, stream_id("init", "net1.weight")).uniform(7));
    CHECK(rng.uniform(6) != rng.uniform(7));
    CHECK(rng.uniform(900) == CounterRng(3, stream_id("init", "net1.weight")).uniform(900));
}

}  // namespace test_rng
