#include <cmath>
#include <limits>

#include "close_enough.h"
#include "core/host_memory.h"
#include "core/tensor.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_tensor {

TEST_CASE("bf16 and fp16 round to nearest even and keep inf and NaN", "[cpu]") {
    CHECK(static_cast<float>(bf16_t(1.0f)) == 1.0f);
    // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1)
    CHECK(static_cast<float>(bf16_t(1.0f + 1.0f / 256)) == 1.0f);
    CHECK(static_cast<float>(bf16_t(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
    CHECK(std::isnan(static_cast<float>(bf16_t(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(static_cast<float>(f16_t(65504.0f)) == 65504.0f);
    CHECK(std::isinf(static_cast<float>(f16_t(65520.0f))));
    CHECK(static_cast<float>(f16_t(1.0f + 1.0f / 2048)) == 1.0f);                        // tie to even
    CHECK(static_cast<float>(f16_t(5.960464477539063e-08f)) == 5.960464477539063e-08f);  // smallest subnormal
    for (uint32_t h = 0; h < 0x7c00; ++h)
        REQUIRE(float_to_half(half_to_float(static_cast<uint16_t>(h))) == h);
}

TEST_CASE("narrow on dim 0 is a view, on other dims a copy with torch.chunk-style offsets", "[cpu]") {
    Tensor t = Tensor::from_doubles({4, 3}, DType::float32, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    Tensor rows = t.narrow(0, 1, 2);
    CHECK(rows.shares_storage(t));
    CHECK(rows.to_doubles() == std::vector<double>{3, 4, 5, 6, 7, 8});
    Tensor cols = t.narrow(1, 1, 2);
    CHECK_FALSE(cols.shares_storage(t));
    CHECK(cols.to_doubles() == std::vector<double>{1, 2, 4, 5, 7, 8, 10, 11});
    rows.set(0, 42);
    CHECK(t.item(3) == 42);
}

TEST_CASE("reshape keeps storage and checks the element count", "[cpu]") {
    Tensor t({2, 6}, DType::float64);
    CHECK(t.reshape({3, 4}).shares_storage(t));
    CHECK_THROWS(t.reshape({5}));
}

TEST_CASE("large host tensors reuse freed blocks and still start zeroed", "[cpu]") {
    const AllocatorStats before = host_block_stats();
    void* first = nullptr;
    {
        Tensor t({1024, 1024}, DType::float32);  // 4 MiB: a large block
        first = t.raw();
        CHECK(reinterpret_cast<uintptr_t>(first) % 64 == 0);
        for (int64_t i = 0; i < t.numel(); i += 4099) t.data<float>()[i] = 7.0f;
    }
    Tensor again({1024, 1024}, DType::float32);  // the same size again: zero-filled
    bool zero = true;
    for (int64_t i = 0; i < again.numel(); ++i) zero = zero && again.data<float>()[i] == 0.0f;
    CHECK(zero);
    const AllocatorStats after = host_block_stats();
    if (host_blocks_from_heap()) {
        CHECK(after.allocations == before.allocations);  // ASan builds: every block from the watched heap
    } else {
        CHECK(again.raw() == first);  // the cached block
        CHECK(after.cache_hits >= before.cache_hits + 1);
        CHECK(after.in_use >= before.in_use + (size_t{4} << 20));
    }
    Tensor small({16}, DType::float32);  // the heap, not the block cache
    CHECK(host_block_stats().allocations == after.allocations);
}

TEST_CASE(
    "the CUDA tests' tolerance: equal infinities and NaN pairs are equal, a NaN against a number is not",
    "[cpu]") {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
    CHECK(testing::close_enough(-inf, -inf, 0.0, 0.0));  // softmax_stats' m of a fully masked row
    CHECK(testing::close_enough(inf, inf, 1e-5, 1e-5));
    CHECK(testing::close_enough(nan, nan, 1e-5, 1e-5));
    CHECK_FALSE(testing::close_enough(-inf, inf, 1e-5, 1e-5));
    CHECK_FALSE(testing::close_enough(-inf, -3.0, 1e-5, 1e-5));
    CHECK_FALSE(testing::close_enough(nan, 1.0, 1e-5, 1e-5));
    CHECK_FALSE(testing::close_enough(1.0, nan, 1e-5, 1e-5));
    CHECK(testing::close_enough(1.0, 1.0 + 1e-6, 0.0, 1e-5));
    CHECK_FALSE(testing::close_enough(1.0, 1.0 + 1e-4, 1e-6, 1e-5));
}

}  // namespace test_tensor
