// A caching allocator, as PyTorch's CUDACachingAllocator: memory that is expensive to get and
// cheap to keep is cached when freed and reused, and every byte is counted: in use, peak in use,
// reserved from the driver, peak reserved. Two users: the CUDA backend's device memory (cudaMalloc
// synchronises the device; `explain --measure` and the memory report read the counters), and
// large host tensors (fresh host pages cost a page fault each; see core/host_memory.h).
//
// Pure host logic over a RawAllocator (cudaMalloc/cudaFree, mmap/munmap, a fake in the tests), so
// it is unit-tested on machines without a GPU.
//   - sizes round up to 512 bytes (every block is 512-byte aligned, as cuBLAS wants); a segment
//     (one driver allocation) is the rounded size of the request that made it;
//   - a request takes the smallest cached block of the same stream that fits. A large request
//     (over 1 MiB, PyTorch's large pool) splits it when more than 1 MiB would be left over: the
//     rest stays cached. A small one uses a block whole and only when that wastes at most
//     max(1 MiB, the request), so small tensors never cut up the blocks large ones need;
//   - a freed block merges with the free blocks beside it in its segment: the pieces a split made
//     become the whole block again (a verify's reference frees whole tensors, its ranks take their
//     shards out of them, and the next reference finds the whole tensors again);
//   - blocks are reused only on the stream that freed them, so a block freed by one rank's stream
//     is never handed to another stream while the first may still be using it;
//   - the cache goes back to the driver a whole segment at a time (a segment with a piece in use
//     stays); when the driver refuses, the cache is returned to it and the request retried once; a
//     second refusal is a RuntimeError naming the request and the counters.
// That is SegmentPolicy::exact, which ptool's own CUDA and host memory use. SegmentPolicy::pytorch
// is PyTorch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp, default settings), which
// explain replays on the simulation's allocations to predict the reserved peak
// (core/allocator_model.h):
//   - two pools: small requests (at most 1 MiB) and large ones, each block of one pool only;
//   - a new segment is 2 MiB for a small request, 20 MiB for a large one under 10 MiB, else the
//     request rounded up to 2 MiB;
//   - best fit within the pool; the block is split when the rest is at least 512 bytes (small pool)
//     or more than 1 MiB (large pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/pointer_map.h"

namespace ptool {

class RawAllocator {
public:
    virtual ~RawAllocator() = default;
    virtual void* malloc(size_t bytes) = 0;        // nullptr when the device is out of memory
    virtual void free(void* p, size_t bytes) = 0;  // bytes: as passed to malloc
};

struct AllocatorStats {
    size_t in_use = 0;  // bytes of live blocks (rounded sizes)
    size_t peak_in_use = 0;
    size_t reserved = 0;  // bytes held from the driver: live + cached
    size_t peak_reserved = 0;
    std::map<uintptr_t, size_t> reserved_by_stream, reserved_by_stream_at_peak;  // the segments' streams
    int64_t allocations = 0;                                                     // requests served
    int64_t cache_hits = 0;  // requests served from the cache
    int64_t driver_allocations = 0;
    int64_t driver_frees = 0;
};

enum class SegmentPolicy { exact, pytorch };

class CachingAllocator {
public:
    static constexpr size_t kRound = 512;
    static constexpr size_t kSmall = size_t{1}
                                     << 20;  // the largest small request; the most a split leaves unused
    static constexpr size_t kSmallSegment = size_t{2} << 20;   // pytorch: kSmallBuffer
    static constexpr size_t kLargeSegment = size_t{20} << 20;  // pytorch: kLargeBuffer
    static constexpr size_t kMinLargeAlloc = size_t{10} << 20;
    static constexpr size_t kRoundLarge = size_t{2} << 20;

    // what: the memory's name in the out-of-memory message ("CUDA", "host"). thread_safe false: its
    // owner serialises every call (the allocator model, under its account's lock), so allocate and
    // release take no lock of their own.
    explicit CachingAllocator(RawAllocator& raw, const char* what = "CUDA",
                              SegmentPolicy policy = SegmentPolicy::exact, bool thread_safe = true)
        : raw_(raw), what_(what), policy_(policy), thread_safe_(thread_safe) {}
    ~CachingAllocator();
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;

    static size_t round_size(size_t bytes) {
        return bytes == 0 ? kRound : (bytes + kRound - 1) / kRound * kRound;
    }
    // The driver allocation a request of `size` (rounded) makes when no cached block serves it.
    size_t segment_size(size_t size) const;

    void* allocate(size_t bytes, uintptr_t stream = 0);
    void release(void* p);  // p from allocate; nullptr is ignored
    // The same for an owner that keeps the block allocate_block returns and hands it back to
    // release_block (the allocator model: core/allocator_model.h), with no lookup of its address.
    // Such a block is not among those the destructor gives back: its owner releases every one first.
    // A piece of a segment; prev/next are its neighbours in the segment (nullptr at its ends).
    struct Block {
        char* ptr;
        size_t size;
        uintptr_t stream;
        bool small = false;  // pytorch: the small pool's (exact: always false)
        bool allocated = false;
        Block* prev = nullptr;
        Block* next = nullptr;
        uint64_t pool = 0;  // its pool's index (stream and small: pool_of), the free set's first key
    };
    Block* allocate_block(size_t bytes, uintptr_t stream = 0);
    void release_block(Block* b);  // nullptr is ignored
    void empty_cache();            // returns every cached block to the driver
    AllocatorStats stats() const;
    void reset_peaks();

private:
    Block* allocate_locked(size_t bytes, uintptr_t stream);
    void release_locked(Block* b);
    // A free block's place in the free set, by (pool, size, address): best fit is a lower_bound. The
    // pool (a stream and small or large) and the size are one word, the pool's index above the size
    // in units of kRound, so that a comparison is two and reads no Block.
    struct FreeKey {
        uint64_t pool_size;
        char* ptr;
        Block* block;
        bool operator<(const FreeKey& o) const {
            return pool_size != o.pool_size ? pool_size < o.pool_size : ptr < o.ptr;
        }
    };
    static constexpr int kPoolShift = 48;  // sizes below 2^48 kRound: 128 PiB
    static uint64_t pool_size(uint64_t pool, size_t size) { return pool << kPoolShift | size / kRound; }
    static FreeKey free_key(Block* b) { return {pool_size(b->pool, b->size), b->ptr, b}; }
    // The index of the pool of `stream`'s small or large blocks, numbered as first seen.
    uint64_t pool_of(uintptr_t stream, bool small);
    std::vector<uintptr_t> streams_;  // pool_of's: a stream's index, times 2, plus small
    // The free set of one pool (pool_of), grown to hold it.
    std::vector<FreeKey>& free_set(uint64_t pool);
    void free_insert(Block* b);
    FreeKey* free_find(Block* b);  // b's entry; null where b is not in the free set
    void free_erase(FreeKey* at);
    // The free set's entry `at` becomes b's (whose key changed: a block cut or merged, in its pool),
    // moving only the entries between its old and new places.
    void free_replace(FreeKey* at, Block* b);
    FreeKey* take_cached(size_t size, uintptr_t stream);  // the entry of the block that serves it, or null
    Block* split(Block* b, size_t size);                  // the rest, free, or null (not cut)
    void absorb_next(Block* a);
    Block* new_block(const Block& b);
    void delete_block(Block* b);
    void free_cached_locked();

    RawAllocator& raw_;
    const char* what_;
    SegmentPolicy policy_;
    bool thread_safe_;
    mutable std::mutex mutex_;
    std::unique_lock<std::mutex> guard() {
        return thread_safe_ ? std::unique_lock<std::mutex>(mutex_) : std::unique_lock<std::mutex>();
    }
    PointerMap<Block*> live_;
    // The free blocks of each pool (indexed by pool_of's index), sorted (FreeKey::operator<). Vectors:
    // a simulated step's free set holds a few dozen blocks (57 on average over every pool, at most 602
    // over `ptool plan` of the 405B on 512 GPUs), where a binary search and a short shift cost less
    // than a tree's nodes (a malloc each, pointer chasing); one per pool, as PyTorch keeps its pools
    // apart, so that a request searches and shifts only its own.
    std::vector<std::vector<FreeKey>> free_;
    std::vector<Block*> spare_;  // blocks merged away, for the next split to reuse (no malloc each)
    AllocatorStats stats_;
};

}  // namespace ptool
