#include "core/host_memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

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
constexpr size_t kMaxCachedUnused = size_t{1} << 30;

// Small blocks stay in the heap: glibc's default serves blocks over 128 KiB with mmap and unmaps
// them on free, which faulted every step's mid-sized tensors in again.
const bool kHeapTuned = [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_ARENA_MAX, 1);  // rank threads: per-thread arenas mmap large blocks regardless of the threshold
    return true;
}();

// Anonymous mappings aligned to 2 MiB with MADV_HUGEPAGE (advice only: where transparent huge
// pages are "never", 4 KiB pages as before; "always" needs none).
class HugePageMappings final : public RawAllocator {
public:
    void* malloc(size_t bytes) override {
        const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
        void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) return nullptr;
        const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
        const uintptr_t aligned = (base + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
        if (aligned > base) munmap(raw, aligned - base);  // the unaligned head and tail go back
        const uintptr_t tail = aligned + size, end = base + size + kHugePage;
        if (end > tail) munmap(reinterpret_cast<void*>(tail), end - tail);
        void* p = reinterpret_cast<void*>(aligned);
        madvise(p, size, MADV_HUGEPAGE);
        sizes_mutex_.lock();
        sizes_[p] = size;
        sizes_mutex_.unlock();
        return p;
    }
    void free(void* p) override {
        sizes_mutex_.lock();
        auto it = sizes_.find(p);
        const size_t size = it->second;
        sizes_.erase(it);
        sizes_mutex_.unlock();
        munmap(p, size);
    }

private:
    std::mutex sizes_mutex_;
    std::unordered_map<void*, size_t> sizes_;
};

// Never destroyed: tensors in static objects may be freed after every other static.
CachingAllocator& large_blocks() {
    static auto* raw = new HugePageMappings;
    static auto* cache = new CachingAllocator(*raw, "host");
    return *cache;
}

}  // namespace

void* host_allocate(size_t bytes) {
    (void)kHeapTuned;
    if (bytes >= kLargeBlock) return large_blocks().allocate(bytes);
    const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw RuntimeError(fmt::format("out of host memory allocating {} bytes", bytes));
    return p;
}

void host_release(void* p, size_t bytes) {
    if (!p) return;
    if (bytes < kLargeBlock) return std::free(p);
    CachingAllocator& cache = large_blocks();
    cache.release(p);
    const AllocatorStats s = cache.stats();
    if (s.reserved - s.in_use > kMaxCachedUnused) cache.empty_cache();
}

AllocatorStats host_block_stats() { return large_blocks().stats(); }

void host_empty_cache() { large_blocks().empty_cache(); }

}  // namespace ptool
