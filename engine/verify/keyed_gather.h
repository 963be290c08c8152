// Keyed gathering: every rank's entries (a key and int64 words) to rank 0 of a communicator in
// one size exchange and one all_gather, whatever each rank holds. The recorder's comparisons and
// digests travel this way: ranks that hold different parts of the model (pipeline stages) queue
// different lists, and rank 0 merges what arrives by key, never by position. Whole tensors (a
// pipeline stage's, under mpirun) travel the same way as words, point-to-point to rank 0 only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ptool {

struct KeyedEntry {
    std::string key;
    std::vector<int64_t> words;
    int rank = 0;  // the rank that queued it (filled in by gather_keyed_to_root)
};

// Collective over comm: on rank 0, every rank's entries in rank order (each rank's in its own
// order); elsewhere, nothing. One size exchange (all_gather), then each rank with entries sends
// them to rank 0 (p2p, received in rank order), so no other rank holds what every rank sent.
std::vector<KeyedEntry> gather_keyed_to_root(Communicator& comm, const std::vector<KeyedEntry>& mine);

// Collective over comm: rank 0's entries on every rank (a size broadcast, then the words).
std::vector<KeyedEntry> broadcast_keyed(Communicator& comm, const std::vector<KeyedEntry>& root_entries);

// A host tensor as words (its dtype, rank, shape, then its bytes, 8 to a word) and back; `words`
// points at `n` words holding one.
std::vector<int64_t> tensor_words(const Tensor& host);
Tensor tensor_from_words(const int64_t* words, size_t n);

}  // namespace ptool
