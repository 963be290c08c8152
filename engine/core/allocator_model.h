// What PyTorch's CUDA caching allocator would reserve for a rank's tensors: the allocations and
// frees of a simulated step (core/memory_account.h) replayed, in order, through a CachingAllocator
// with PyTorch's segment policy (core/caching_allocator.h, SegmentPolicy::pytorch) over a driver
// that hands out addresses and no memory. The reserved peak is torch.cuda.max_memory_reserved(),
// what torchtitan reports; its excess over the allocated peak is the allocator's block rounding
// and fragmentation.
//
// With a capacity (the GPU's memory less what is not the allocator's: CUDA context, NCCL buffers)
// the driver refuses a segment that would cross it, so the allocator gives its cached segments
// back and retries, as PyTorch does before it raises an out-of-memory error; a second refusal is
// counted (`over_capacity`) and granted, so that the replay goes on and reports how far over it went.
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/caching_allocator.h"
#include "core/pointer_map.h"

namespace ptool {

// Not thread-safe: its owner serialises every call (MemoryAccount holds its lock around them).
class AllocatorModel {
public:
    explicit AllocatorModel(size_t capacity = 0);  // 0: no capacity
    ~AllocatorModel();
    AllocatorModel(const AllocatorModel&) = delete;
    AllocatorModel& operator=(const AllocatorModel&) = delete;

    // key: the tensor storage's identity; stream: the CUDA stream it is allocated on (a block freed
    // on one stream is reused on that stream only)
    void allocate(const void* key, size_t bytes, uintptr_t stream = 0);
    void release(const void* key);  // a key never allocated (or of 0 bytes) is ignored
    // Starts over from an empty device with what is live now, allocated again in the order it was:
    // a run's memory after its model is built, as torchtitan builds it (on meta, then each rank's
    // shards materialised), without the construction's transients.
    void restart();
    size_t reserved() const;
    size_t peak_reserved() const;
    std::map<uintptr_t, size_t> reserved_by_stream_at_peak() const;
    size_t in_use() const;  // the blocks handed out (rounded sizes), as max_memory_allocated counts them
    size_t peak_in_use() const;
    int64_t over_capacity() const;  // segments granted beyond the capacity

    // A step's allocations and frees, recorded from record_step() until replay_step(), played once
    // more as the next step's: every object the step allocated allocated again (under no key: those
    // the replay leaves live are held to the model's end, and a restart() drops them as transients),
    // freed where it was; an object the step freed that an earlier step had allocated is, in
    // the next step, the one of the same bytes and stream that this step allocated and left live
    // (the held model output, the gradients set_to_none frees: a steady state hands its objects on
    // one step to the next), paired in their allocation order. Returns false, replaying nothing,
    // where that pairing does not hold (a step that is not the steady state): simulate it instead.
    void record_step();
    bool replay_step();

private:
    void release_blocks();
    struct Event {
        const void* key;
        size_t bytes;
        uintptr_t stream;
        int64_t order;  // a release's: the object's allocation order
        bool release;
    };
    bool recording_ = false;
    std::vector<Event> events_;
    class Driver;
    struct Live {
        int64_t order;  // allocation order
        size_t bytes;
        CachingAllocator::Block* block;
        uintptr_t stream;
    };
    size_t capacity_;
    std::unique_ptr<Driver> driver_;
    std::unique_ptr<CachingAllocator> allocator_;
    PointerMap<Live> blocks_;
    // blocks whose key was allocated again before its release, and a replayed step's objects left
    // live: held, as the allocator held them when it tracked addresses, and given back with it
    std::vector<CachingAllocator::Block*> orphans_;
    int64_t next_order_ = 0;
};

}  // namespace ptool
