#include "core/allocator_model.h"

#include <algorithm>
#include <map>
#include <utility>
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
      allocator_(
          std::make_unique<CachingAllocator>(*driver_, "modelled CUDA", SegmentPolicy::pytorch, false)) {}

AllocatorModel::~AllocatorModel() {
    release_blocks();
}

// Every block the model holds (live and orphaned) back to its allocator, before the allocator goes.
void AllocatorModel::release_blocks() {
    blocks_.for_each([&](const void*, const Live& live) { allocator_->release_block(live.block); });
    for (CachingAllocator::Block* b : orphans_) allocator_->release_block(b);
    orphans_.clear();
    blocks_.clear();
}

void AllocatorModel::allocate(const void* key, size_t bytes, uintptr_t stream) {
    if (bytes == 0) return;  // PyTorch allocates nothing for an empty tensor
    if (recording_) events_.push_back({key, bytes, stream, next_order_, false});
    CachingAllocator::Block* block = allocator_->allocate_block(bytes, stream);
    auto [live, fresh] = blocks_.try_emplace(key);
    if (!fresh) orphans_.push_back(live->block);
    *live = {next_order_++, bytes, block, stream};
}

void AllocatorModel::restart() {
    std::vector<std::pair<const void*, Live>> live;
    live.reserve(blocks_.size());
    blocks_.for_each([&](const void* key, const Live& l) { live.emplace_back(key, l); });
    std::sort(live.begin(), live.end(),
              [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    release_blocks();    // the old allocator's own
    allocator_.reset();  // before its driver
    driver_ = std::make_unique<Driver>(capacity_);
    allocator_ = std::make_unique<CachingAllocator>(*driver_, "modelled CUDA", SegmentPolicy::pytorch, false);
    for (const auto& [key, l] : live) allocate(key, l.bytes, l.stream);
}

void AllocatorModel::release(const void* key) {
    Live l{};
    if (!blocks_.take(key, &l)) return;
    if (recording_) events_.push_back({key, l.bytes, l.stream, l.order, true});
    allocator_->release_block(l.block);
}

void AllocatorModel::record_step() {
    recording_ = true;
    events_.clear();
    // a step allocates and frees about as many objects as the model has allocated since its start
    // (what it holds and the step before): room for them, not grown from nothing
    events_.reserve(2 * static_cast<size_t>(next_order_));
}

bool AllocatorModel::replay_step() {
    recording_ = false;
    const std::vector<Event> events = std::move(events_);
    events_.clear();
    using Kind = std::pair<size_t, uintptr_t>;       // bytes, stream
    std::vector<int64_t> object(events.size(), -1);  // a release's allocation in the step (-1: older)
    std::vector<bool> freed(events.size(), false);
    PointerMap<size_t> open;                                        // key -> its allocation, while live
    std::map<Kind, std::vector<std::pair<int64_t, size_t>>> older;  // earlier steps' freed: (order, event)
    for (size_t i = 0; i < events.size(); ++i) {
        const Event& e = events[i];
        if (!e.release) {
            open.insert_or_assign(e.key, i);
        } else if (const size_t* a = open.find(e.key)) {
            object[i] = static_cast<int64_t>(*a), freed[*a] = true, open.erase(e.key);
        } else {
            older[{e.bytes, e.stream}].push_back({e.order, i});
        }
    }
    // what the step leaves live of its own, by kind in allocation order: the next step frees them
    // where this step freed the older ones of their kind, paired in allocation order
    std::map<Kind, std::vector<size_t>> handed_on;
    for (size_t i = 0; i < events.size(); ++i)
        if (!events[i].release && !freed[i]) handed_on[{events[i].bytes, events[i].stream}].push_back(i);
    if (handed_on.size() != older.size()) return false;
    // an older object's release -> the key freed next
    std::vector<const void*> release_of(events.size(), nullptr);
    for (auto& [kind, list] : older) {
        auto it = handed_on.find(kind);
        if (it == handed_on.end() || it->second.size() != list.size()) return false;
        std::sort(list.begin(), list.end());
        for (size_t j = 0; j < list.size(); ++j) release_of[list[j].second] = events[it->second[j]].key;
    }
    // the next step's own objects held by their event, not under a key (no lookups): those it
    // leaves live are the model's until it goes (kept with the orphans), as no storage frees them
    std::vector<CachingAllocator::Block*> own(events.size(), nullptr);
    for (size_t i = 0; i < events.size(); ++i) {
        const Event& e = events[i];
        if (!e.release) {
            own[i] = allocator_->allocate_block(e.bytes, e.stream);
            ++next_order_;
        } else if (object[i] >= 0) {
            allocator_->release_block(std::exchange(own[static_cast<size_t>(object[i])], nullptr));
        } else {
            release(release_of[i]);
        }
    }
    for (CachingAllocator::Block* b : own)
        if (b) orphans_.push_back(b);
    return true;
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
