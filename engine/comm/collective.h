// The collectives, as data: one row each (collective.cpp's table), as nccl-tests keeps each of its
// tests in one row. A row holds the name every printout uses, which tensor a counter counts the
// bytes of (comm_stats.h), the bus factor (the bytes a rank moves per byte counted, over a ring of n:
// nccl-tests' busbw = algbw x factor) and the link latencies one call pays (the time model's hops,
// plan/time_model.h). The communicators, the counters, explain and the time model all read it.
//
//   collective      counted bytes        bus factor   hops per call
//   all_gather      the gathered output  (n-1)/n      n-1
//   all_reduce      the tensor           2(n-1)/n     2(n-1)
//   all_to_all      the input            (n-1)/n      n-1
//   broadcast       the tensor           1            n-1
//   recv            the tensor           1            1
//   reduce_scatter  the input            (n-1)/n      n-1
//   send            the tensor           1            1
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ptool {

// In the names' alphabetical order: maps keyed by a Collective list them as they did when keyed by
// the name (explain, verify and the reports print in that order).
enum class Collective { all_gather, all_reduce, all_to_all, broadcast, recv, reduce_scatter, send };
inline constexpr int kCollectives = 7;

// Which tensor's bytes a counter counts for a collective (PyTorch's CommDebugMode's).
enum class CountedTensor { tensor, input, output };

struct CollectiveRow {
    Collective op;
    const char* name;  // as printed: "all_reduce", ...
    CountedTensor counted;
    double (*bus_factor)(int n);  // bytes each rank moves per counted byte, over n ranks
    double (*hops)(int n);        // link latencies one call pays over n ranks
    bool p2p;                     // a point-to-point op (send, recv): between two ranks, not a group
};

const CollectiveRow& collective_row(Collective c);
const char* collective_name(Collective c);                          // "all_reduce", ...
std::optional<Collective> collective_named(std::string_view name);  // nullopt: no collective's name
// The bytes each rank of n moves for a collective counted as `bytes` (nccl-tests' bus bytes).
double bus_bytes(Collective c, double bytes, int n);

}  // namespace ptool
