// Tensors drawn from the counter-based RNG, kept per process by a key that names everything their
// values depend on (seed, stream, shape, dtype, distribution), the most recently kept first, up to
// a byte budget. A verify's reference run and each of its rank threads need the same generated
// batch and the same initial parameters: the first draws them, the others copy (a shard copies its
// box of the whole tensor). Drawing is deterministic, so a copy is bitwise what a draw would give;
// the cache changes time, never values. The cached tensors belong to no run's memory account.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/tensor.h"

namespace ptool {

class DrawnCache {
public:
    explicit DrawnCache(int64_t budget_bytes) : budget_(budget_bytes) {}
    // the cached tensor (storage shared with the cache: read it, never write it), or an undefined one
    Tensor find(const std::string& key);
    // find, else draw() (under the cache's lock: concurrent callers wait for the first one's draw)
    // and keep what it drew; the draw runs outside every memory account
    Tensor find_or_draw(const std::string& key, const std::function<Tensor()>& draw);
    void keep(const std::string& key,
              const Tensor& t);  // keeps a host copy of t (nothing when it is not kept)
    void clear();

private:
    // tensors up to a quarter of the budget: a model of a few large tensors (134M parameters in
    // two 256 MiB weights) is drawn as before, its verify's peak memory unmoved by the cache
    bool keeps(const Tensor& t) const;
    Tensor find_locked(const std::string& key) const;
    void keep_locked(const std::string& key, Tensor t);
    struct Entry {
        std::string key;
        Tensor t;
    };
    const int64_t budget_;
    std::mutex mutex_;
    std::list<Entry> entries_;  // the most recently kept first
    std::unordered_map<std::string, std::list<Entry>::iterator>
        index_;  // by key: a model of 16,000 layers draws 32,000 tensors
    int64_t bytes_ = 0;
};

// The process's cache of generated data and initial parameters (256 MiB, tensors up to 64 MiB).
DrawnCache& drawn_tensors();

}  // namespace ptool
