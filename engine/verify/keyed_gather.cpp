#include "verify/keyed_gather.h"

#include <cstring>

#include "core/device_memory.h"
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

// Every entry packed in `packed` (`n` words, from `rank`) appended to out.
void unpack(const int64_t* w, int64_t n, int rank, std::vector<KeyedEntry>& out) {
    int64_t at = 0;
    while (at < n) {
        KeyedEntry e;
        e.rank = rank;
        PTOOL_REQUIRE(at + 2 <= n, "a keyed entry of rank {} overruns its part", rank);
        const int64_t key_len = w[at], count = w[at + 1];
        PTOOL_REQUIRE(key_len >= 0 && count >= 0 && at + 2 + (key_len + 7) / 8 + count <= n,
                      "a keyed entry of rank {} overruns its part", rank);
        e.key.assign(reinterpret_cast<const char*>(w + at + 2), static_cast<size_t>(key_len));
        at += 2 + (key_len + 7) / 8;
        e.words.assign(w + at, w + at + count);
        at += count;
        out.push_back(std::move(e));
    }
}

Tensor words_tensor(const std::vector<int64_t>& packed) {
    Tensor t({static_cast<int64_t>(packed.size())}, DType::int64);
    if (!packed.empty()) std::memcpy(t.data<int64_t>(), packed.data(), packed.size() * sizeof(int64_t));
    return t;
}

// Every rank's packed size, rank by rank (one all_gather).
Tensor packed_sizes(Communicator& comm, const std::vector<int64_t>& packed) {
    Tensor size = Tensor::scalar(static_cast<double>(packed.size()), DType::float64).reshape({1});
    Tensor sizes({comm.size()}, DType::float64);
    comm.all_gather(size, sizes);
    return sizes;
}

std::vector<int64_t> pack_all(const std::vector<KeyedEntry>& entries) {
    std::vector<int64_t> packed;
    for (const KeyedEntry& e : entries) pack(e, packed);
    return packed;
}

constexpr int kKeyedTag = 4093;  // gather_keyed_to_root's messages (after a step: no other p2p in flight)

}  // namespace

std::vector<KeyedEntry> gather_keyed_to_root(Communicator& comm, const std::vector<KeyedEntry>& mine) {
    const std::vector<int64_t> packed = pack_all(mine);
    const Tensor sizes = packed_sizes(comm, packed);
    std::vector<KeyedEntry> out;
    if (comm.rank() != 0) {
        if (!packed.empty()) comm.send(words_tensor(packed), 0, kKeyedTag);
        return out;
    }
    unpack(packed.data(), static_cast<int64_t>(packed.size()), 0, out);
    for (int r = 1; r < comm.size(); ++r) {
        const auto n = static_cast<int64_t>(sizes.item(r));
        if (n == 0) continue;
        Tensor theirs({n}, DType::int64);
        comm.recv(theirs, r, kKeyedTag);
        unpack(theirs.data<int64_t>(), n, r, out);
    }
    return out;
}

std::vector<KeyedEntry> broadcast_keyed(Communicator& comm, const std::vector<KeyedEntry>& root_entries) {
    const std::vector<int64_t> packed = comm.rank() == 0 ? pack_all(root_entries) : std::vector<int64_t>{};
    Tensor size = Tensor::scalar(static_cast<double>(packed.size()), DType::float64).reshape({1});
    comm.broadcast(size, 0);
    const auto n = static_cast<int64_t>(size.item(0));
    Tensor all = comm.rank() == 0 ? words_tensor(packed) : Tensor({n}, DType::int64);
    if (n > 0) comm.broadcast(all, 0);
    std::vector<KeyedEntry> out;
    unpack(n > 0 ? all.data<int64_t>() : nullptr, n, 0, out);
    return out;
}

std::vector<int64_t> tensor_words(const Tensor& host) {
    PTOOL_REQUIRE(host.device() == Device::cpu, "tensor_words of a {} tensor", device_name(host.device()));
    std::vector<int64_t> w{static_cast<int64_t>(host.dtype()), host.dim()};
    w.insert(w.end(), host.shape().begin(), host.shape().end());
    const size_t at = w.size(), bytes = host.nbytes();
    w.resize(at + (bytes + 7) / 8, 0);
    if (bytes) std::memcpy(w.data() + at, host.raw(), bytes);
    return w;
}

Tensor tensor_from_words(const int64_t* words, size_t n) {
    PTOOL_REQUIRE(n >= 2 && words[1] >= 0 && static_cast<size_t>(2 + words[1]) <= n,
                  "a tensor's words are cut short");
    const auto dtype = static_cast<DType>(words[0]);
    const Shape shape(words + 2, words + 2 + words[1]);
    Tensor t(shape, dtype);
    const size_t at = 2 + static_cast<size_t>(words[1]), bytes = t.nbytes();
    PTOOL_REQUIRE(at + (bytes + 7) / 8 == n, "a tensor's words hold {} bytes, not the {} of {}", (n - at) * 8,
                  bytes, shape_str(shape));
    if (bytes) std::memcpy(t.raw(), words + at, bytes);
    return t;
}

}  // namespace ptool
