#include "core/caching_allocator.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ptool {
namespace {

// The first free-set entry not below k (std::lower_bound's), its comparisons as one 128-bit
// compare and its steps without branches: a simulated step searches its free set millions of
// times, and a branch on each comparison is a coin flip.
template <class Key>
Key* lower_bound_of(std::vector<Key>& set, const Key& k) {
    Key* first = set.data();
    size_t n = set.size();
    auto word = [](const Key& e) {
        return static_cast<unsigned __int128>(e.pool_size) << 64 | reinterpret_cast<uintptr_t>(e.ptr);
    };
    if (n == 0) return first;
    const unsigned __int128 key = word(k);
    while (n > 1) {
        const size_t half = n / 2;
        first = word(first[half]) < key ? first + half : first;
        n -= half;
    }
    return first + (word(*first) < key);
}

}  // namespace

CachingAllocator::~CachingAllocator() {
    std::lock_guard lock(mutex_);
    free_cached_locked();
    // tensors outliving the backend: give their segments back anyway, each once (from its first block)
    std::vector<Block*> heads;
    live_.for_each([&](const void*, Block* b) {
        Block* h = b;
        while (h->prev) h = h->prev;
        heads.push_back(h);
    });
    std::sort(heads.begin(), heads.end());
    heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
    for (Block* h : heads) {
        size_t size = 0;
        for (const Block* b = h; b; b = b->next) size += b->size;
        raw_.free(h->ptr, size);
        for (Block* b = h; b;) delete std::exchange(b, b->next);
    }
    for (Block* b : spare_) delete b;
}

size_t CachingAllocator::segment_size(size_t size) const {
    if (policy_ == SegmentPolicy::exact) return size;
    if (size <= kSmall) return kSmallSegment;
    if (size < kMinLargeAlloc) return kLargeSegment;
    return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

// The smallest free block of `stream` that serves `size` (see the header's rules): its entry in the
// free set, left there.
CachingAllocator::FreeKey* CachingAllocator::take_cached(size_t size, uintptr_t stream) {
    const uint64_t pool = pool_of(stream, policy_ == SegmentPolicy::pytorch && size <= kSmall);
    std::vector<FreeKey>& set = free_set(pool);
    FreeKey* it = lower_bound_of(set, FreeKey{pool_size(pool, size), nullptr, nullptr});
    if (it == set.data() + set.size()) return nullptr;
    const size_t found = (it->pool_size & ((uint64_t{1} << kPoolShift) - 1)) * kRound;
    if (policy_ == SegmentPolicy::exact && size <= kSmall && found - size > std::max(kSmall, size))
        return nullptr;  // small: whole blocks, bounded waste
    return it;
}

// Cuts b (free) to `size` when the rest is worth keeping (exact: a large request leaving more than
// kSmall; pytorch: the rest is at least kRound in the small pool, more than kSmall in the large);
// the rest becomes a free block after it, returned (not yet in the free set).
CachingAllocator::Block* CachingAllocator::split(Block* b, size_t size) {
    const size_t rest_size = b->size - size;
    if (policy_ == SegmentPolicy::exact ? size <= kSmall || rest_size <= kSmall
        : b->small                      ? rest_size < kRound
                                        : rest_size <= kSmall)
        return nullptr;
    Block* rest = new_block({b->ptr + size, rest_size, b->stream, b->small, false, b, b->next, b->pool});
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    return rest;
}

uint64_t CachingAllocator::pool_of(uintptr_t stream, bool small) {
    size_t i = 0;
    while (i < streams_.size() && streams_[i] != stream) ++i;
    if (i == streams_.size()) {
        PTOOL_REQUIRE(2 * i + 1 < (uint64_t{1} << (64 - kPoolShift)), "caching allocator: over {} streams",
                      i);
        streams_.push_back(stream);
    }
    return 2 * i + small;
}

CachingAllocator::Block* CachingAllocator::new_block(const Block& b) {
    if (spare_.empty()) return new Block(b);
    Block* out = spare_.back();
    spare_.pop_back();
    *out = b;
    return out;
}

void CachingAllocator::delete_block(Block* b) {
    spare_.push_back(b);
}

std::vector<CachingAllocator::FreeKey>& CachingAllocator::free_set(uint64_t pool) {
    if (pool >= free_.size()) free_.resize(pool + 1);
    return free_[pool];
}

void CachingAllocator::free_insert(Block* b) {
    const FreeKey k = free_key(b);
    std::vector<FreeKey>& set = free_[b->pool];
    set.insert(set.begin() + (lower_bound_of(set, k) - set.data()), k);
}

CachingAllocator::FreeKey* CachingAllocator::free_find(Block* b) {
    const FreeKey k = free_key(b);
    std::vector<FreeKey>& set = free_[b->pool];
    FreeKey* it = lower_bound_of(set, k);
    return it != set.data() + set.size() && it->block == b ? it : nullptr;
}

void CachingAllocator::free_erase(FreeKey* at) {
    // the pool from the key (its block may be merged away by now: release_locked)
    std::vector<FreeKey>& set = free_[at->pool_size >> kPoolShift];
    set.erase(set.begin() + (at - set.data()));
}

void CachingAllocator::free_replace(FreeKey* at, Block* b) {
    const FreeKey k = free_key(b);
    FreeKey* to = lower_bound_of(free_[b->pool], k);
    if (to <= at) {  // earlier: the entries from its new place on move up one, over its old one
        std::move_backward(to, at, at + 1);
        *to = k;
    } else {  // later: the entries after its old place and before its new one move down one
        std::move(at + 1, to, at);
        *(to - 1) = k;
    }
}

// a absorbs the block after it in its segment (both free, neither in the free set).
void CachingAllocator::absorb_next(Block* a) {
    Block* n = a->next;
    a->size += n->size;
    a->next = n->next;
    if (n->next) n->next->prev = a;
    delete_block(n);
}

void* CachingAllocator::allocate(size_t bytes, uintptr_t stream) {
    const auto lock = guard();
    Block* b = allocate_locked(bytes, stream);
    live_.insert_or_assign(b->ptr, b);
    return b->ptr;
}

CachingAllocator::Block* CachingAllocator::allocate_block(size_t bytes, uintptr_t stream) {
    const auto lock = guard();
    return allocate_locked(bytes, stream);
}

CachingAllocator::Block* CachingAllocator::allocate_locked(size_t bytes, uintptr_t stream) {
    const size_t size = round_size(bytes);
    // the free set's key holds a size in kRound units below its pool's bits
    // (a model's tensor can ask for more: explain of 2^40 tokens' logits, 512 PiB; no device holds it)
    if (!(size / kRound < (uint64_t{1} << kPoolShift) && bytes <= size))
        throw RuntimeError(
            fmt::format("{}: a tensor of {} bytes ({:.3g} PiB), beyond any device's memory "
                        "(the caching allocator addresses less than 128 PiB)",
                        what_, bytes, static_cast<double>(bytes) / std::pow(2.0, 50)));
    ++stats_.allocations;
    Block* b = nullptr;
    if (FreeKey* it = take_cached(size, stream)) {
        ++stats_.cache_hits;
        b = it->block;
        // its entry becomes the rest's where it is cut, else leaves the free set
        if (Block* rest = split(b, size))
            free_replace(it, rest);
        else
            free_erase(it);
    } else {
        const size_t segment = segment_size(size);
        void* p = raw_.malloc(segment);
        if (!p) {  // out of memory: give the cache back and try once more
            free_cached_locked();
            p = raw_.malloc(segment);
        }
        if (!p)
            throw RuntimeError(
                fmt::format("{} out of memory: tried to allocate {} bytes; {} bytes in use, {} reserved, "
                            "peak {} in use",
                            what_, size, stats_.in_use, stats_.reserved, stats_.peak_in_use));
        ++stats_.driver_allocations;
        stats_.reserved += segment;
        stats_.reserved_by_stream[stream] += segment;
        if (stats_.reserved > stats_.peak_reserved)
            stats_.peak_reserved = stats_.reserved,
            stats_.reserved_by_stream_at_peak = stats_.reserved_by_stream;
        const bool small = policy_ == SegmentPolicy::pytorch && size <= kSmall;
        b = new_block(
            {static_cast<char*>(p), segment, stream, small, false, nullptr, nullptr, pool_of(stream, small)});
        if (Block* rest = split(b, size)) free_insert(rest);
    }
    b->allocated = true;
    stats_.in_use += b->size;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return b;
}

void CachingAllocator::release(void* p) {
    if (!p) return;
    const auto lock = guard();
    Block** found = live_.find(p);
    PTOOL_REQUIRE(found != nullptr, "caching allocator: release of a pointer it did not allocate");
    Block* b = *found;
    live_.erase(p);
    release_locked(b);
}

void CachingAllocator::release_block(Block* b) {
    if (!b) return;
    const auto lock = guard();
    release_locked(b);
}

void CachingAllocator::release_locked(Block* b) {
    stats_.in_use -= b->size;
    b->allocated = false;
    // merge with the free neighbours: b absorbs the next one, the previous one absorbs b; the
    // merged block takes a neighbour's entry in the free set (the previous one's where both are free)
    FreeKey* at = nullptr;
    if (Block* n = b->next; n && !n->allocated) {
        at = free_find(n);
        absorb_next(b);
    }
    if (Block* q = b->prev; q && !q->allocated) {
        if (at) free_erase(at);
        at = free_find(q);
        absorb_next(q);
        b = q;
    }
    if (at)
        free_replace(at, b);
    else
        free_insert(b);
}

void CachingAllocator::empty_cache() {
    std::lock_guard lock(mutex_);
    free_cached_locked();
}

// Every free block that is a whole segment goes back to the driver.
void CachingAllocator::free_cached_locked() {
    for (std::vector<FreeKey>& set : free_) {
        auto kept = set.begin();  // each pool's free set compacted in one pass, in order
        for (const FreeKey& k : set) {
            Block* b = k.block;
            if (b->prev || b->next) {
                *kept++ = k;
                continue;
            }
            raw_.free(b->ptr, b->size);
            stats_.reserved -= b->size;
            stats_.reserved_by_stream[b->stream] -= b->size;
            ++stats_.driver_frees;
            delete_block(b);
        }
        set.erase(kept, set.end());
    }
}

AllocatorStats CachingAllocator::stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
}

void CachingAllocator::reset_peaks() {
    std::lock_guard lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
    stats_.peak_reserved = stats_.reserved;
    stats_.reserved_by_stream_at_peak = stats_.reserved_by_stream;
}

}  // namespace ptool
