// The CUDA backend's host-side logic, which runs on every machine: the caching allocator's
// accounting (over a host fake of cudaMalloc), the kernels' launch sizes, and the lazy loading
// of libraries (cuBLAS and NCCL are dlopened on first use), here over libm.
#include <cstdlib>
#include <set>
#include <vector>

#include "backend/cuda/dl_library.h"
#include "backend/cuda/launch_config.h"
#include "core/caching_allocator.h"
#include "test_helpers.h"

using namespace ptool;

namespace {
struct FakeDriver final : RawAllocator {
    size_t capacity = size_t{1} << 30, used = 0;
    std::set<void*> live;
    std::vector<size_t> sizes;
    std::unordered_map<void*, size_t> size_of;
    void* malloc(size_t bytes) override {
        if (used + bytes > capacity) return nullptr;
        void* p = std::aligned_alloc(512, bytes);
        live.insert(p), size_of[p] = bytes, used += bytes, sizes.push_back(bytes);
        return p;
    }
    void free(void* p, size_t bytes) override {
        REQUIRE(live.erase(p) == 1);   // a double free or a foreign pointer would fail here
        REQUIRE(bytes == size_of[p]);  // the size it was allocated with
        used -= size_of[p];
        std::free(p);
    }
};
}  // namespace

TEST_CASE("caching allocator rounds to 512 bytes and counts in-use, peak and reserved bytes", "[cpu]") {
    FakeDriver driver;
    {
        CachingAllocator a(driver);
        CHECK(CachingAllocator::round_size(0) == 512);
        CHECK(CachingAllocator::round_size(1) == 512);
        CHECK(CachingAllocator::round_size(512) == 512);
        CHECK(CachingAllocator::round_size(513) == 1024);
        void* p = a.allocate(1000);
        void* q = a.allocate(4096);
        CHECK(reinterpret_cast<uintptr_t>(p) % 512 == 0);
        AllocatorStats s = a.stats();
        CHECK(s.in_use == 1024 + 4096);
        CHECK(s.reserved == 1024 + 4096);
        CHECK(s.driver_allocations == 2);
        a.release(p);
        s = a.stats();
        CHECK(s.in_use == 4096);
        CHECK(s.peak_in_use == 1024 + 4096);
        CHECK(s.reserved == 1024 + 4096);  // cached, not returned
        a.reset_peaks();
        CHECK(a.stats().peak_in_use == 4096);
        a.release(q);
        CHECK(a.stats().in_use == 0);
        a.empty_cache();
        CHECK(a.stats().reserved == 0);
        CHECK(driver.live.empty());
        CHECK(a.stats().driver_frees == 2);
    }
    CHECK(driver.used == 0);
}

TEST_CASE("caching allocator reuses the smallest fitting block of the same stream only", "[cpu]") {
    FakeDriver driver;
    CachingAllocator a(driver);
    void* big = a.allocate(8192, 1);
    void* small = a.allocate(2048, 1);
    a.release(big);
    a.release(small);
    CHECK(a.allocate(1500, 1) == small);  // smallest block that fits
    CHECK(a.allocate(2048, 2) != big);    // another stream: a fresh block, never stream 1's
    CHECK(a.stats().cache_hits == 1);
    CHECK(a.allocate(8000, 1) == big);
    CHECK(a.stats().cache_hits == 2);
    // a cached block much larger than a small request is not used for it (small requests never
    // split a block, and waste at most max(1 MiB, the request))
    void* huge = a.allocate(size_t{64} << 20, 3);
    a.release(huge);
    void* tiny = a.allocate(512, 3);
    CHECK(tiny != huge);
    a.release(tiny);
    CHECK(a.allocate((size_t{64} << 20) - 4096, 3) == huge);
}

TEST_CASE("caching allocator splits cached blocks for large requests and merges freed pieces back", "[cpu]") {
    constexpr size_t MiB = size_t{1} << 20;
    FakeDriver driver;
    {
        CachingAllocator a(driver);
        char* whole = static_cast<char*>(a.allocate(16 * MiB));
        a.release(whole);
        // two 8 MiB shards out of the freed 16 MiB tensor, back to back: no driver allocation
        char* left = static_cast<char*>(a.allocate(8 * MiB));
        char* right = static_cast<char*>(a.allocate(8 * MiB));
        CHECK(left == whole);
        CHECK(right == whole + 8 * MiB);
        AllocatorStats s = a.stats();
        CHECK(s.driver_allocations == 1);
        CHECK(s.cache_hits == 2);
        CHECK(s.in_use == 16 * MiB);
        CHECK(s.reserved == 16 * MiB);
        // a split leaves at most 1 MiB unused: 15.5 MiB takes a whole 16 MiB block
        a.release(left);
        a.release(right);  // merged: the 16 MiB block again, whatever the order of the frees
        CHECK(a.allocate(16 * MiB) == whole);
        a.release(whole);
        char* most = static_cast<char*>(a.allocate(15 * MiB + MiB / 2));
        CHECK(most == whole);
        CHECK(a.stats().in_use == 16 * MiB);
        a.release(most);
        // three pieces freed middle, right, left merge back into one block
        char* p1 = static_cast<char*>(a.allocate(4 * MiB));
        char* p2 = static_cast<char*>(a.allocate(4 * MiB));
        char* p3 = static_cast<char*>(a.allocate(8 * MiB));
        CHECK(p2 == p1 + 4 * MiB);
        CHECK(p3 == p2 + 4 * MiB);
        CHECK(a.stats().driver_allocations == 1);
        a.release(p2);
        a.release(p3);
        CHECK(a.allocate(12 * MiB) == p2);  // p2 and p3 merged
        a.release(p2);
        // a small request does not cut the large block
        void* small = a.allocate(4096);
        CHECK(small != static_cast<void*>(p1));
        CHECK(a.stats().driver_allocations == 2);
        // only whole segments go back: the one with p1 in use stays
        a.empty_cache();
        CHECK(a.stats().reserved == 16 * MiB + 4096);
        CHECK(driver.live.size() == 2);
        a.release(p1);
        a.empty_cache();
        CHECK(a.stats().reserved == 4096);
        CHECK(driver.live.size() == 1);
        // another stream never takes a piece of this stream's blocks
        char* s1 = static_cast<char*>(a.allocate(16 * MiB, 1));
        a.release(s1);
        void* s2 = a.allocate(8 * MiB, 2);
        CHECK((static_cast<char*>(s2) < s1 || static_cast<char*>(s2) >= s1 + 16 * MiB));
        // tensors outliving the allocator: each segment back once, with the size it was allocated with
        a.allocate(4 * MiB, 1);
        a.allocate(4 * MiB, 1);
    }
    CHECK(driver.live.empty());
    CHECK(driver.used == 0);
}

TEST_CASE("caching allocator frees its cache and retries when the driver is out of memory", "[cpu]") {
    FakeDriver driver;
    driver.capacity = 3 << 20;
    CachingAllocator a(driver);
    void* p = a.allocate(2 << 20);
    a.release(p);                           // cached: 2 MiB reserved, 0 in use
    void* q = a.allocate(size_t{5} << 19);  // 2.5 MiB: does not fit next to the cached block
    CHECK(q != nullptr);
    CHECK(a.stats().reserved == size_t{5} << 19);
    CHECK(a.stats().driver_frees == 1);
    try {
        a.allocate(size_t{1} << 20);
        FAIL("expected an out-of-memory error");
    } catch (const RuntimeError& e) {
        CHECK(std::string(e.what()).find(
                  "CUDA out of memory: tried to allocate 1048576 bytes; 2621440 bytes in use") !=
              std::string::npos);
    }
    CHECK(a.stats().in_use == size_t{5} << 19);  // the failed request changed nothing
    a.release(q);
    CHECK_THROWS_WITH(a.release(reinterpret_cast<void*>(0x1000)), Catch::Contains("did not allocate"));
}

TEST_CASE("launch sizes: grid-stride elementwise and one block per row", "[cpu]") {
    using namespace ptool::cuda;
    CHECK(elementwise_launch(0, 132).grid == 0);
    CHECK(elementwise_launch(1, 132).grid == 1);
    CHECK(elementwise_launch(256, 132).grid == 1);
    CHECK(elementwise_launch(257, 132).grid == 2);
    CHECK(elementwise_launch(int64_t{1} << 40, 132).grid ==
          132 * 32);  // beyond int range: capped, the kernel loops
    CHECK(elementwise_launch(1000, 0).grid == 1);
    CHECK(elementwise_launch(1000, 132).block == 256);
    CHECK(row_block(1) == 32);
    CHECK(row_block(33) == 64);
    CHECK(row_block(4096) == 1024);
    CHECK(rows_launch(0, 10).grid == 0);
    CHECK(rows_launch(10, 100).grid == 10);
    CHECK(rows_launch(10, 100).block == 128);
    CHECK(rows_launch(int64_t{1} << 20, 8).grid == 65535);
    CHECK(reduction_shared_bytes(1024, 2, 4) == 256);
}

namespace {
struct MathApi {
    double (*cos)(double) = nullptr;
    double (*missing)(double) = nullptr;
};
}  // namespace

TEST_CASE("a lazily loaded library fills its table once, or says which library or symbol is missing",
          "[cpu]") {
    static int fills = 0;
    cuda::LazyLibrary<MathApi> libm("libm.so.6", "libm", [](const cuda::DlSymbols& resolve, MathApi& api) {
        ++fills;
        return resolve("cos", api.cos);
    });
    REQUIRE(libm.get() != nullptr);
    CHECK(libm.get()->cos(0.0) == 1.0);
    CHECK(libm.error().empty());
    CHECK(fills == 1);  // loaded on the first get() only

    cuda::LazyLibrary<MathApi> lacking("libm.so.6", "libm", [](const cuda::DlSymbols& resolve, MathApi& api) {
        return resolve("cos", api.cos) && resolve("ptool_no_such_symbol", api.missing);
    });
    CHECK(lacking.get() == nullptr);
    CHECK(lacking.error() == "libm has no symbol ptool_no_such_symbol");

    cuda::LazyLibrary<MathApi> absent("libptool-absent.so.1", "libptool-absent",
                                      [](const cuda::DlSymbols&, MathApi&) { return true; });
    CHECK(absent.get() == nullptr);
    CHECK(absent.error().rfind("cannot load libptool-absent.so.1: ", 0) == 0);
}
