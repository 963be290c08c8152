// The CUDA backend's host-side logic, which runs on every machine: the caching allocator's
// accounting (over a host fake of cudaMalloc), the kernels' launch sizes, and the lazy loading
// of libraries (cuBLAS and NCCL are dlopened on first use), here over libm.
#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>
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

namespace {
constexpr size_t kMiB = size_t{1} << 20;

// A driver that never refuses and touches no memory, for the differential test below: addresses
// from a bump pointer, each segment 2 MiB aligned with a 2 MiB gap after it, so that no two
// segments touch. The real allocator and the reference model each get one; for the same sequence
// of calls they hand out the same addresses.
struct BumpDriver final : RawAllocator {
    uintptr_t next = uintptr_t{1} << 40;
    std::map<uintptr_t, size_t> live;  // address -> bytes
    void* malloc(size_t bytes) override {
        const uintptr_t p = next;
        next += (bytes + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB) + 2 * kMiB;
        live.emplace(p, bytes);
        return reinterpret_cast<void*>(p);
    }
    void free(void* p, size_t bytes) override {
        const auto it = live.find(reinterpret_cast<uintptr_t>(p));
        REQUIRE(it != live.end());
        REQUIRE(it->second == bytes);
        live.erase(it);
    }
};

// A deliberately naive model of SegmentPolicy::pytorch, written from the rules in
// core/caching_allocator.h's comment and nothing else: each segment keeps its blocks in a list in
// address order, the free blocks of every pool are one ordered set, and everything is found by the
// plainest search.
struct PytorchModel {
    struct Block {
        uintptr_t addr;
        size_t size;
        bool used;
    };
    struct Segment {
        uintptr_t stream;
        bool small;
        std::vector<Block> blocks;  // in address order, covering the segment
    };
    // (stream, small, size, address): a pool's free blocks by size, then address, so that the best
    // fit (the smallest that fits, the lowest address among equals) is a lower_bound
    using FreeEntry = std::tuple<uintptr_t, bool, size_t, uintptr_t>;

    BumpDriver& driver;
    std::map<uintptr_t, Segment> segments;  // by base address
    std::set<FreeEntry> free_blocks;
    size_t in_use = 0, peak_in_use = 0, reserved = 0, peak_reserved = 0;

    static size_t round(size_t bytes) { return bytes == 0 ? 512 : (bytes + 511) / 512 * 512; }
    static size_t segment_size(size_t size) {
        if (size <= kMiB) return 2 * kMiB;
        if (size < 10 * kMiB) return 20 * kMiB;
        return (size + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
    }
    static FreeEntry entry(const Segment& s, const Block& b) { return {s.stream, s.small, b.size, b.addr}; }
    void erase_free(const Segment& s, const Block& b) {
        if (free_blocks.erase(entry(s, b)) != 1) FAIL("model: a free block missing from the free set");
    }
    // The segment holding addr, and the index in it of the block that starts at addr.
    std::pair<Segment*, size_t> find(uintptr_t addr) {
        auto it = segments.upper_bound(addr);
        if (it == segments.begin()) FAIL("model: no segment holds " << addr);
        Segment& s = std::prev(it)->second;
        for (size_t i = 0; i < s.blocks.size(); ++i)
            if (s.blocks[i].addr == addr) return {&s, i};
        FAIL("model: no block starts at " << addr);
        return {nullptr, 0};
    }

    uintptr_t allocate(size_t bytes, uintptr_t stream) {
        const size_t size = round(bytes);
        const bool small = size <= kMiB;
        Segment* seg = nullptr;
        size_t i = 0;
        const auto fit = free_blocks.lower_bound({stream, small, size, 0});
        if (fit != free_blocks.end() && std::get<0>(*fit) == stream && std::get<1>(*fit) == small) {
            std::tie(seg, i) = find(std::get<3>(*fit));
            free_blocks.erase(fit);
        } else {  // nothing cached fits: a new segment, one free block
            const size_t seg_size = segment_size(size);
            const auto base = reinterpret_cast<uintptr_t>(driver.malloc(seg_size));
            reserved += seg_size;
            peak_reserved = std::max(peak_reserved, reserved);
            seg = &(segments[base] = Segment{stream, small, {Block{base, seg_size, false}}});
        }
        const size_t rest = seg->blocks[i].size - size;
        if (small ? rest >= 512 : rest > kMiB) {  // split: the rest stays free right after it
            seg->blocks[i].size = size;
            const Block r{seg->blocks[i].addr + size, rest, false};
            seg->blocks.insert(seg->blocks.begin() + static_cast<std::ptrdiff_t>(i) + 1, r);
            free_blocks.insert(entry(*seg, r));
        }
        Block& b = seg->blocks[i];
        b.used = true;
        in_use += b.size;
        peak_in_use = std::max(peak_in_use, in_use);
        return b.addr;
    }

    void release(uintptr_t addr) {
        auto [seg, i] = find(addr);
        std::vector<Block>& bl = seg->blocks;
        if (!bl[i].used) FAIL("model: release of a free block");
        bl[i].used = false;
        in_use -= bl[i].size;
        if (i + 1 < bl.size() && !bl[i + 1].used) {  // absorbs the free block after it
            erase_free(*seg, bl[i + 1]);
            bl[i].size += bl[i + 1].size;
            bl.erase(bl.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        }
        if (i > 0 && !bl[i - 1].used) {  // absorbed by the free block before it
            erase_free(*seg, bl[i - 1]);
            bl[i - 1].size += bl[i].size;
            bl.erase(bl.begin() + static_cast<std::ptrdiff_t>(i));
            --i;
        }
        free_blocks.insert(entry(*seg, bl[i]));
    }

    // Every segment that is one free block goes back to the driver.
    void empty_cache() {
        for (auto it = segments.begin(); it != segments.end();) {
            const Segment& s = it->second;
            if (s.blocks.size() == 1 && !s.blocks[0].used) {
                erase_free(s, s.blocks[0]);
                driver.free(reinterpret_cast<void*>(it->first), s.blocks[0].size);
                reserved -= s.blocks[0].size;
                it = segments.erase(it);
            } else {
                ++it;
            }
        }
    }
};
}  // namespace

TEST_CASE(
    "caching allocator under the pytorch policy agrees with a naive model over 200000 random requests and "
    "releases on 3 streams",
    "[cpu]") {
    BumpDriver real_driver, model_driver;
    CachingAllocator a(real_driver, "CUDA", SegmentPolicy::pytorch);
    PytorchModel model{model_driver};
    std::mt19937_64 rng(0x5eed2024);
    auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    // sizes: small ones (at most 1 MiB) and large ones up to 64 MiB, each half the time one of a few
    // repeated values (equal free blocks: address tie-breaks; exact fits; rests at the split limits).
    // Stream 2's large requests are at most 12 MiB, so that its pool runs out of blocks that fit them
    // and new segments are made for requests on both sides of 10 MiB.
    static constexpr size_t small_sizes[] = {0,     1,      512,        4096, 4096, 65536,
                                             65536, 200000, kMiB - 512, kMiB, kMiB};
    static constexpr size_t large_sizes[] = {kMiB + 1,        2 * kMiB,  3 * kMiB,        8 * kMiB,
                                             10 * kMiB - 512, 10 * kMiB, 10 * kMiB + 512, 16 * kMiB,
                                             19 * kMiB,       20 * kMiB, 64 * kMiB};
    auto draw_size = [&](uintptr_t stream) -> size_t {
        const size_t kind = below(100);
        if (kind < 30) return small_sizes[below(std::size(small_sizes))];
        if (kind < 45) return 1 + below(8192);  // tiny: rounded to a few 512-byte multiples
        if (kind < 65) return 1 + below(kMiB);
        if (stream == 2) return kind < 82 ? large_sizes[below(7)] : kMiB + 1 + below(11 * kMiB);
        if (kind < 82) return large_sizes[below(std::size(large_sizes))];
        return kMiB + 1 + below(63 * kMiB);
    };
    auto compare = [&] {
        const AllocatorStats s = a.stats();
        REQUIRE(s.in_use == model.in_use);
        REQUIRE(s.peak_in_use == model.peak_in_use);
        REQUIRE(s.reserved == model.reserved);
        REQUIRE(s.peak_reserved == model.peak_reserved);
    };
    struct Live {
        void* p;
        size_t bytes;
        uintptr_t stream;
    };
    std::vector<Live> live;
    constexpr int kOps = 200000;
    for (int op = 0; op < kOps; ++op) {
        if (op == kOps / 2) {
            INFO("empty_cache before op " << op);
            a.empty_cache();
            model.empty_cache();
            compare();
            REQUIRE(real_driver.live == model_driver.live);
        }
        // the live allocations aimed at: phases of 2,500 operations, few and more by turns, the more
        // rising over the run (16 to 640), so that new segments are made all along
        const size_t phase = op / 2500;
        const size_t target = phase % 2 ? 8 : 16 + 16 * (phase / 2);
        if (live.empty() || below(100) < (live.size() < target ? 60 : 40)) {
            const auto stream = static_cast<uintptr_t>(below(3));
            const size_t bytes = draw_size(stream);
            INFO("op " << op << ": allocate " << bytes << " bytes on stream " << stream);
            void* p = a.allocate(bytes, stream);
            REQUIRE(reinterpret_cast<uintptr_t>(p) == model.allocate(bytes, stream));
            compare();
            live.push_back({p, bytes, stream});
        } else {
            const size_t k = below(live.size());
            const Live l = live[k];
            live[k] = live.back();
            live.pop_back();
            INFO("op " << op << ": release " << l.p << " (" << l.bytes << " bytes on stream " << l.stream
                       << ")");
            a.release(l.p);
            model.release(reinterpret_cast<uintptr_t>(l.p));
            compare();
        }
    }
    for (const Live& l : live) {
        a.release(l.p);
        model.release(reinterpret_cast<uintptr_t>(l.p));
    }
    AllocatorStats s = a.stats();
    CHECK(s.in_use == 0);
    CHECK(model.in_use == 0);
    CHECK(s.reserved == model.reserved);
    CHECK(s.peak_reserved == model.peak_reserved);
    a.empty_cache();
    model.empty_cache();
    CHECK(a.stats().reserved == 0);
    CHECK(model.reserved == 0);
    CHECK(real_driver.live.empty());
    CHECK(model_driver.live.empty());
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
