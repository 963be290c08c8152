#include "model/drawn_cache.h"

#include "core/memory_account.h"

namespace ptool {

Tensor DrawnCache::find_locked(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? Tensor() : it->second->t;
}

Tensor DrawnCache::find(const std::string& key) {
    std::lock_guard lock(mutex_);
    return find_locked(key);
}

Tensor DrawnCache::find_or_draw(const std::string& key, const std::function<Tensor()>& draw) {
    std::lock_guard lock(mutex_);
    if (Tensor t = find_locked(key); t.defined()) return t;
    Tensor drawn;
    {
        MemoryScope no_run(nullptr);
        drawn = draw();
    }
    keep_locked(key, drawn);
    return drawn;
}

void DrawnCache::keep(const std::string& key, const Tensor& t) {
    if (!keeps(t)) return;
    Tensor copy;
    {
        MemoryScope no_run(nullptr);
        copy = t.to_device(Device::cpu);  // host memory: a GPU's stays the run's
    }
    std::lock_guard lock(mutex_);
    if (!find_locked(key).defined()) keep_locked(key, std::move(copy));  // else another rank kept it first
}

bool DrawnCache::keeps(const Tensor& t) const {
    return static_cast<int64_t>(t.nbytes()) <= budget_ / 4;
}

void DrawnCache::keep_locked(const std::string& key, Tensor t) {
    if (!keeps(t)) return;
    if (auto it = index_.find(key); it != index_.end()) {  // a key is kept once (callers look first)
        bytes_ -= static_cast<int64_t>(it->second->t.nbytes());
        entries_.erase(it->second);
        index_.erase(it);
    }
    bytes_ += static_cast<int64_t>(t.nbytes());
    entries_.push_front({key, std::move(t)});
    index_[key] = entries_.begin();
    while (bytes_ > budget_) {  // the least recently kept go first (the newest always fits: keeps())
        bytes_ -= static_cast<int64_t>(entries_.back().t.nbytes());
        index_.erase(entries_.back().key);
        entries_.pop_back();
    }
}

void DrawnCache::clear() {
    std::lock_guard lock(mutex_);
    entries_.clear();
    index_.clear();
    bytes_ = 0;
}

DrawnCache& drawn_tensors() {
    static auto* cache = new DrawnCache(int64_t{256} << 20);  // never destroyed: tensors may outlive statics
    return *cache;
}

}  // namespace ptool
