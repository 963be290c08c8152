#include "core/host_memory.h"

#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/cores.h"
#include "core/error.h"

namespace ptool {
namespace {

// Under AddressSanitizer every block comes from the heap, so that an overflow of a large tensor is
// still reported (ASan does not watch mmap'd memory or a block reused from a cache).
#if defined(__SANITIZE_ADDRESS__)
#define PTOOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PTOOL_ASAN 1
#endif
#endif
#ifdef PTOOL_ASAN
constexpr size_t kLargeBlock = ~size_t{0};
#else
constexpr size_t kLargeBlock = size_t{1} << 20;
#endif
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMinCachedUnused = size_t{1} << 30;

// Small blocks stay in the heap: glibc's default serves blocks over 128 KiB with mmap and unmaps
// them on free, which faulted every step's mid-sized tensors in again. As many arenas as cores:
// one arena shared by every thread serialised the planner's simulations on its lock (plan of a
// 405B model on 512 GPUs: 21.5 s on two threads, 15.2 s on one, 9.7 s with an arena each; verify
// as fast as before), and glibc's default of 8 per core reserves 64 MiB of address space for each
// (a thousand rank threads under `ulimit -v` run out of it sooner). Blocks of 1 MiB and more come
// from large_blocks().
const bool kHeapTuned = [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_ARENA_MAX, usable_cores());
    return true;
}();

// Anonymous mappings aligned to 2 MiB with MADV_HUGEPAGE (advice only: where transparent huge
// pages are "never", 4 KiB pages as before; "always" needs none).
class HugePageMappings final : public RawAllocator {
public:
    static size_t mapped_size(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
    void* malloc(size_t bytes) override {
        const size_t size = mapped_size(bytes);
        void* raw =
            mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) return nullptr;
        const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
        const uintptr_t aligned = (base + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
        if (aligned > base) munmap(raw, aligned - base);  // the unaligned head and tail go back
        const uintptr_t tail = aligned + size, end = base + size + kHugePage;
        if (end > tail) munmap(reinterpret_cast<void*>(tail), end - tail);
        void* p = reinterpret_cast<void*>(aligned);
        madvise(p, size, MADV_HUGEPAGE);
        return p;
    }
    void free(void* p, size_t bytes) override { munmap(p, mapped_size(bytes)); }
};

// Never destroyed: tensors in static objects may be freed after every other static.
CachingAllocator& large_blocks() {
    static auto* raw = new HugePageMappings;
    static auto* cache = new CachingAllocator(*raw, "host");
    return *cache;
}

}  // namespace

void* host_allocate(size_t bytes, bool zero) {
    (void)kHeapTuned;
    const size_t padded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;  // whole 64-byte lines
    void* p = bytes >= kLargeBlock ? large_blocks().allocate(padded) : std::aligned_alloc(64, padded);
    if (!p) throw RuntimeError(fmt::format("out of host memory allocating {} bytes", bytes));
    if (zero) std::memset(p, 0, padded);
    return p;
}

void host_release(void* p, size_t bytes) {
    if (!p) return;
    if (bytes < kLargeBlock) return std::free(p);
    CachingAllocator& cache = large_blocks();
    cache.release(p);
    const AllocatorStats s = cache.stats();
    // unused blocks are kept up to what is in use (at least 1 GiB): a model freed while its record
    // lives on is the next model's memory, not fresh pages the kernel zeroes again
    if (s.reserved - s.in_use > std::max(kMinCachedUnused, s.in_use)) cache.empty_cache();
}

AllocatorStats host_block_stats() {
    return large_blocks().stats();
}

int64_t available_host_memory() {
    std::FILE* f = std::fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kib = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
    std::fclose(f);
    return static_cast<int64_t>(kib) * 1024;
}

int64_t address_space_left() {
    rlimit limit{};
    if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "VmSize: %lld kB", &kib) == 1) break;
    std::fclose(f);
    if (kib < 0) return -1;
    const auto cap = static_cast<int64_t>(std::min<rlim_t>(limit.rlim_cur, rlim_t{INT64_MAX}));
    return std::max<int64_t>(0, cap - static_cast<int64_t>(kib) * 1024);
}

bool host_blocks_from_heap() {
    return kLargeBlock == ~size_t{0};
}

}  // namespace ptool
