#include "verify/keyed_gather.h"

#include <cstring>

#include "core/error.h"
#include "core/tensor.h"

namespace ptool {
namespace {

// An entry as words: the key's length, the words' count, the key's bytes (8 to a word), the words.
void pack(const KeyedEntry& e, std::vector<int64_t>& out) {
    out.push_back(static_cast<int64_t>(e.key.size()));
    out.push_back(static_cast<int64_t>(e.words.size()));
    const size_t at = out.size();
    out.resize(at + (e.key.size() + 7) / 8, 0);
    if (!e.key.empty()) std::memcpy(out.data() + at, e.key.data(), e.key.size());
    out.insert(out.end(), e.words.begin(), e.words.end());
}

}  // namespace

std::vector<KeyedEntry> gather_keyed(Communicator& comm, const std::vector<KeyedEntry>& mine) {
    std::vector<int64_t> packed;
    for (const KeyedEntry& e : mine) pack(e, packed);
    Tensor size = Tensor::scalar(static_cast<double>(packed.size()), DType::float64).reshape({1});
    Tensor sizes({comm.size()}, DType::float64);
    comm.all_gather(size, sizes);
    int64_t total = 0;
    for (int r = 0; r < comm.size(); ++r) total += static_cast<int64_t>(sizes.item(r));
    Tensor in({static_cast<int64_t>(packed.size())}, DType::int64), all({total}, DType::int64);
    if (!packed.empty()) std::memcpy(in.data<int64_t>(), packed.data(), packed.size() * sizeof(int64_t));
    comm.all_gather(in, all);
    std::vector<KeyedEntry> out;
    if (comm.rank() != 0) return out;
    const int64_t* w = all.data<int64_t>();
    int64_t at = 0;
    for (int r = 0; r < comm.size(); ++r) {
        const int64_t end = at + static_cast<int64_t>(sizes.item(r));
        while (at < end) {
            KeyedEntry e;
            e.rank = r;
            const int64_t key_len = w[at], n = w[at + 1];
            PTOOL_REQUIRE(key_len >= 0 && n >= 0 && at + 2 + (key_len + 7) / 8 + n <= end,
                          "a keyed entry of rank {} overruns its part", r);
            e.key.assign(reinterpret_cast<const char*>(w + at + 2), static_cast<size_t>(key_len));
            at += 2 + (key_len + 7) / 8;
            e.words.assign(w + at, w + at + n);
            at += n;
            out.push_back(std::move(e));
        }
    }
    return out;
}

}  // namespace ptool
