#include "model/drawn_cache.h"

#include "core/memory_account.h"

namespace ptool {

Tensor DrawnCache::find_locked(const std::string& key) const {
    for (const Entry& e : entries_)
        if (e.key == key) return e.t;
    return {};
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
        copy = t.clone();
    }
    std::lock_guard lock(mutex_);
    if (!find_locked(key).defined()) keep_locked(key, std::move(copy));  // else another rank kept it first
}

bool DrawnCache::keeps(const Tensor& t) const { return static_cast<int64_t>(t.nbytes()) <= budget_ / 4; }

void DrawnCache::keep_locked(const std::string& key, Tensor t) {
    if (!keeps(t)) return;
    entries_.push_front({key, std::move(t)});
    int64_t bytes = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if ((bytes += static_cast<int64_t>(it->t.nbytes())) > budget_) {
            entries_.erase(it, entries_.end());
            break;
        }
}

void DrawnCache::clear() {
    std::lock_guard lock(mutex_);
    entries_.clear();
}

DrawnCache& drawn_tensors() {
    static auto* cache = new DrawnCache(int64_t{256} << 20);  // never destroyed: tensors may outlive statics
    return *cache;
}

}  // namespace ptool
