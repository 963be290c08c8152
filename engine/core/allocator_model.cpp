#include "core/allocator_model.h"

#include <algorithm>
#include <vector>

namespace ptool {

// Addresses from a counter, 512-byte aligned as the allocator's blocks are; nothing behind them.
class AllocatorModel::Driver : public RawAllocator {
public:
    explicit Driver(size_t capacity) : capacity_(capacity) {}
    void* malloc(size_t bytes) override {
        if (capacity_ > 0 && held_ + bytes > capacity_) {
            if (!refused_) {
                refused_ = true;  // the allocator frees its cache and asks again
                return nullptr;
            }
            ++over_capacity_;
        }
        refused_ = false;
        held_ += bytes;
        next_ += bytes;
        return reinterpret_cast<void*>(next_ - bytes);
    }
    void free(void*, size_t bytes) override { held_ -= bytes; }
    int64_t over_capacity() const { return over_capacity_; }

private:
    size_t capacity_, held_ = 0;
    uintptr_t next_ = CachingAllocator::kRound;  // never null
    bool refused_ = false;
    int64_t over_capacity_ = 0;
};

AllocatorModel::AllocatorModel(size_t capacity)
    : capacity_(capacity),
      driver_(std::make_unique<Driver>(capacity)),
      allocator_(std::make_unique<CachingAllocator>(*driver_, "modelled CUDA", SegmentPolicy::pytorch)) {}

AllocatorModel::~AllocatorModel() {
    for (auto& [key, live] : blocks_) allocator_->release(live.block);
}

void AllocatorModel::allocate(const void* key, size_t bytes, uintptr_t stream) {
    if (bytes == 0) return;  // PyTorch allocates nothing for an empty tensor
    blocks_[key] = {next_order_++, bytes, allocator_->allocate(bytes, stream), stream};
}

void AllocatorModel::restart() {
    std::vector<std::pair<const void*, Live>> live(blocks_.begin(), blocks_.end());
    std::sort(live.begin(), live.end(),
              [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    blocks_.clear();
    allocator_.reset();  // before its driver
    driver_ = std::make_unique<Driver>(capacity_);
    allocator_ = std::make_unique<CachingAllocator>(*driver_, "modelled CUDA", SegmentPolicy::pytorch);
    for (const auto& [key, l] : live) allocate(key, l.bytes, l.stream);
}

void AllocatorModel::release(const void* key) {
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return;
    allocator_->release(it->second.block);
    blocks_.erase(it);
}

size_t AllocatorModel::reserved() const {
    return allocator_->stats().reserved;
}

size_t AllocatorModel::peak_reserved() const {
    return allocator_->stats().peak_reserved;
}

std::map<uintptr_t, size_t> AllocatorModel::reserved_by_stream_at_peak() const {
    return allocator_->stats().reserved_by_stream_at_peak;
}

size_t AllocatorModel::in_use() const {
    return allocator_->stats().in_use;
}

size_t AllocatorModel::peak_in_use() const {
    return allocator_->stats().peak_in_use;
}

int64_t AllocatorModel::over_capacity() const {
    return driver_->over_capacity();
}

}  // namespace ptool
