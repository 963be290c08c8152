// A caching allocator, as PyTorch's CUDACachingAllocator: memory that is expensive to get and
// cheap to keep is cached when freed and reused, and every byte is counted: in use, peak in use,
// reserved from the driver, peak reserved. Two users: the CUDA backend's device memory (cudaMalloc
// synchronises the device; `explain --measure` and the memory report read the counters), and
// large host tensors (fresh host pages cost a page fault each; see core/host_memory.h).
//
// Pure host logic over a RawAllocator (cudaMalloc/cudaFree, mmap/munmap, a fake in the tests), so
// it is unit-tested on machines without a GPU.
//   - sizes round up to 512 bytes (every block is 512-byte aligned, as cuBLAS wants);
//   - a request takes the smallest cached block of the same stream that fits and wastes at most
//     max(1 MiB, the request) (no splitting: a block is used whole);
//   - blocks are reused only on the stream that freed them, so a block freed by one rank's stream
//     is never handed to another stream while the first may still be using it;
//   - when the driver refuses, the cache is returned to it and the request retried once; a second
//     refusal is a RuntimeError naming the request and the counters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace ptool {

class RawAllocator {
public:
    virtual ~RawAllocator() = default;
    virtual void* malloc(size_t bytes) = 0;  // nullptr when the device is out of memory
    virtual void free(void* p, size_t bytes) = 0;  // bytes: as passed to malloc
};

struct AllocatorStats {
    size_t in_use = 0;         // bytes of live blocks (rounded sizes)
    size_t peak_in_use = 0;
    size_t reserved = 0;       // bytes held from the driver: live + cached
    size_t peak_reserved = 0;
    int64_t allocations = 0;   // requests served
    int64_t cache_hits = 0;    // requests served from the cache
    int64_t driver_allocations = 0;
    int64_t driver_frees = 0;
};

class CachingAllocator {
public:
    static constexpr size_t kRound = 512;
    static constexpr size_t kMaxWaste = size_t{1} << 20;

    // what: the memory's name in the out-of-memory message ("CUDA", "host")
    explicit CachingAllocator(RawAllocator& raw, const char* what = "CUDA") : raw_(raw), what_(what) {}
    ~CachingAllocator();
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;

    static size_t round_size(size_t bytes) { return bytes == 0 ? kRound : (bytes + kRound - 1) / kRound * kRound; }

    void* allocate(size_t bytes, uintptr_t stream = 0);
    void release(void* p);  // p from allocate; nullptr is ignored
    void empty_cache();     // returns every cached block to the driver
    AllocatorStats stats() const;
    void reset_peaks();

private:
    struct Block {
        size_t size;
        uintptr_t stream;
    };
    void free_cached_locked();

    RawAllocator& raw_;
    const char* what_;
    mutable std::mutex mutex_;
    std::unordered_map<void*, Block> live_;
    std::multimap<std::pair<uintptr_t, size_t>, void*> cached_;  // (stream, size) -> block
    AllocatorStats stats_;
};

}  // namespace ptool
