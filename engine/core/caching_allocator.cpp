#include "core/caching_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace ptool {

CachingAllocator::~CachingAllocator() {
    std::lock_guard lock(mutex_);
    free_cached_locked();
    for (auto& [p, b] : live_) raw_.free(p, b.size);  // tensors outliving the backend: give the memory back anyway
}

void* CachingAllocator::allocate(size_t bytes, uintptr_t stream) {
    const size_t size = round_size(bytes);
    std::lock_guard lock(mutex_);
    ++stats_.allocations;
    void* p = nullptr;
    size_t got = size;
    auto it = cached_.lower_bound({stream, size});
    if (it != cached_.end() && it->first.first == stream && it->first.second - size <= std::max(kMaxWaste, size)) {
        p = it->second;
        got = it->first.second;
        cached_.erase(it);
        ++stats_.cache_hits;
    } else {
        p = raw_.malloc(size);
        if (!p) {  // out of memory: give the cache back and try once more
            free_cached_locked();
            p = raw_.malloc(size);
        }
        if (!p)
            throw RuntimeError(fmt::format("{} out of memory: tried to allocate {} bytes; {} bytes in use, {} reserved, "
                                           "peak {} in use",
                                           what_, size, stats_.in_use, stats_.reserved, stats_.peak_in_use));
        ++stats_.driver_allocations;
        stats_.reserved += size;
        stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    }
    live_.emplace(p, Block{got, stream});
    stats_.in_use += got;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return p;
}

void CachingAllocator::release(void* p) {
    if (!p) return;
    std::lock_guard lock(mutex_);
    auto it = live_.find(p);
    PTOOL_REQUIRE(it != live_.end(), "caching allocator: release of a pointer it did not allocate");
    stats_.in_use -= it->second.size;
    cached_.emplace(std::pair{it->second.stream, it->second.size}, p);
    live_.erase(it);
}

void CachingAllocator::empty_cache() {
    std::lock_guard lock(mutex_);
    free_cached_locked();
}

void CachingAllocator::free_cached_locked() {
    for (auto& [key, p] : cached_) {
        raw_.free(p, key.second);
        stats_.reserved -= key.second;
        ++stats_.driver_frees;
    }
    cached_.clear();
}

AllocatorStats CachingAllocator::stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
}

void CachingAllocator::reset_peaks() {
    std::lock_guard lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
    stats_.peak_reserved = stats_.reserved;
}

}  // namespace ptool
