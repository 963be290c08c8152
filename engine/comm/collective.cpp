#include "comm/collective.h"

#include "core/error.h"

namespace ptool {
namespace {

// (n-1)/n: each rank receives the others' pieces once
double ring(int n) {
    return static_cast<double>(n - 1) / n;
}
double one(int) {
    return 1;
}
double ring_hops(int n) {
    return n - 1;
}

const CollectiveRow table[kCollectives] = {
    {Collective::all_gather, "all_gather", CountedTensor::output, ring, ring_hops, false},
    {Collective::all_reduce, "all_reduce", CountedTensor::tensor, [](int n) { return 2 * ring(n); },
     [](int n) { return 2 * ring_hops(n); }, false},  // reduce_scatter, then all_gather
    {Collective::all_to_all, "all_to_all", CountedTensor::input, ring, ring_hops, false},
    {Collective::broadcast, "broadcast", CountedTensor::tensor, one, ring_hops, false},
    {Collective::recv, "recv", CountedTensor::tensor, one, one, true},
    {Collective::reduce_scatter, "reduce_scatter", CountedTensor::input, ring, ring_hops, false},
    {Collective::send, "send", CountedTensor::tensor, one, one, true},
};

}  // namespace

const CollectiveRow& collective_row(Collective c) {
    const CollectiveRow& row = table[static_cast<int>(c)];
    PTOOL_REQUIRE(row.op == c, "collective table out of order at {}", row.name);
    return row;
}

const char* collective_name(Collective c) {
    return collective_row(c).name;
}

std::optional<Collective> collective_named(std::string_view name) {
    for (const CollectiveRow& row : table)
        if (name == row.name) return row.op;
    return std::nullopt;
}

double bus_bytes(Collective c, double bytes, int n) {
    return collective_row(c).bus_factor(n) * bytes;
}

}  // namespace ptool
