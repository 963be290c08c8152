// PointerMap: a hash map from an object's address to a small value, open-addressed (linear probing,
// deletion by backward shift), for the memory accounts' per-storage bookkeeping
// (core/memory_account.h, core/allocator_model.h, core/caching_allocator.h): every tensor a
// simulated step allocates is inserted and erased once in each, and std::unordered_map's node per
// entry cost a malloc and a free each time (perf: a third of `ptool plan`'s pipeline sampling was
// the accounts' bookkeeping). Its iteration order is the slots', which no user depends on (they
// sort where order matters). Not thread-safe: its owners hold their locks.
//
//   PointerMap<int64_t> m;
//   m.insert_or_assign(p, 3);
//   if (int64_t* v = m.find(p)) ...;
//   m.erase(p);
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ptool {

template <class V>
class PointerMap {
public:
    PointerMap() { slots_.resize(kInitial); }

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

    V* find(const void* key) {
        for (size_t i = home(key);; i = next(i)) {
            Slot& s = slots_[i];
            if (!s.key) return nullptr;
            if (s.key == key) return &s.value;
        }
    }

    // The key's value, replaced where the key is present (key: not null).
    V& insert_or_assign(const void* key, V value) {
        auto [v, inserted] = try_emplace(key);
        (void)inserted;
        return *v = std::move(value);
    }

    // The key's value, and whether it was absent (then inserted, value-initialised): one probe.
    std::pair<V*, bool> try_emplace(const void* key) {
        size_t i = home(key);
        for (;; i = next(i)) {
            if (slots_[i].key == key) return {&slots_[i].value, false};
            if (!slots_[i].key) break;
        }
        ++size_;
        if (2 * size_ > slots_.size()) {  // at most half full: short probes
            grow();
            return {&place(key, V{}), true};
        }
        slots_[i].key = key, slots_[i].value = V{};
        return {&slots_[i].value, true};
    }

    // Removes the key; false where it is absent.
    bool erase(const void* key) { return take(key, nullptr); }

    // Removes the key, its value moved to *out first (out may be null); false where it is absent:
    // find and erase in one probe.
    bool take(const void* key, V* out) {
        size_t i = home(key);
        for (;; i = next(i)) {
            if (!slots_[i].key) return false;
            if (slots_[i].key == key) break;
        }
        if (out) *out = std::move(slots_[i].value);
        // backward shift: each later entry of the run moves into the hole when its home allows it
        for (size_t j = next(i);; j = next(j)) {
            Slot& s = slots_[j];
            if (!s.key) break;
            const size_t h = home(s.key);
            // s may move to i when i lies cyclically in [h, j)
            if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
                slots_[i] = std::move(s);
                s.key = nullptr;
                i = j;
            }
        }
        slots_[i].key = nullptr;
        --size_;
        return true;
    }

    template <class F>
    void for_each(F&& f) const {
        for (const Slot& s : slots_)
            if (s.key) f(s.key, s.value);
    }

    void clear() {
        slots_.assign(kInitial, Slot{});
        size_ = 0, shift_ = 64 - kInitialBits;
    }

private:
    static constexpr int kInitialBits = 6;
    static constexpr size_t kInitial = size_t{1} << kInitialBits;
    struct Slot {
        const void* key = nullptr;
        V value{};
    };
    std::vector<Slot> slots_;
    size_t size_ = 0;
    int shift_ = 64 - kInitialBits;

    size_t home(const void* key) const {
        // Fibonacci hashing of the address (its low bits are alignment, the same for every key)
        const uint64_t h = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key)) * 0x9E3779B97F4A7C15ull;
        return static_cast<size_t>(h >> shift_);  // the product's high bits, as many as the slots need
    }
    size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }

    V& place(const void* key, V value) {
        size_t i = home(key);
        while (slots_[i].key) i = next(i);
        slots_[i].key = key, slots_[i].value = std::move(value);
        return slots_[i].value;
    }

    void grow() {
        std::vector<Slot> old(slots_.size() * 2);
        old.swap(slots_);
        --shift_;
        for (Slot& s : old)
            if (s.key) place(s.key, std::move(s.value));
    }
};

}  // namespace ptool
