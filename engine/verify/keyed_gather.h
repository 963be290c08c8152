// Keyed gathering: every rank's entries (a key and int64 words) to rank 0 of a communicator in
// one size exchange and one all_gather, whatever each rank holds. The recorder's comparisons and
// digests travel this way: ranks that hold different parts of the model (pipeline stages) queue
// different lists, and rank 0 merges what arrives by key, never by position.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ptool {

struct KeyedEntry {
    std::string key;
    std::vector<int64_t> words;
    int rank = 0;  // the rank that queued it (filled in by gather_keyed)
};

// Collective over comm: on rank 0, every rank's entries in rank order (each rank's in its own
// order); elsewhere, nothing.
std::vector<KeyedEntry> gather_keyed(Communicator& comm, const std::vector<KeyedEntry>& mine);

}  // namespace ptool
