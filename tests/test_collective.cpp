// The collectives' table (comm/collective.h): names, bus factors, hops and the order maps keyed by
// a Collective print in.
#include <string>

#include "comm/collective.h"
#include "comm/comm_stats.h"
#include "test_helpers.h"

using namespace ptool;

TEST_CASE("every collective's name round-trips, in alphabetical order", "[cpu]") {
    std::string previous;
    for (int i = 0; i < kCollectives; ++i) {
        const auto c = static_cast<Collective>(i);
        const std::string name = collective_name(c);
        INFO(name);
        CHECK(collective_row(c).op == c);
        CHECK(collective_named(name) == c);
        CHECK(previous < name);  // a map keyed by Collective lists them as one keyed by the name did
        previous = name;
    }
    CHECK(std::string(collective_name(Collective::all_reduce)) == "all_reduce");
    CHECK(std::string(collective_name(Collective::reduce_scatter)) == "reduce_scatter");
    CHECK(!collective_named("allreduce"));
    CHECK(!collective_named("all_to_all_v"));
}

TEST_CASE("bus factors and bytes are nccl-tests' per collective", "[cpu]") {
    for (int n : {2, 4, 8}) {
        INFO(n);
        const double ring = static_cast<double>(n - 1) / n;
        CHECK(collective_row(Collective::all_reduce).bus_factor(n) == 2 * ring);
        CHECK(collective_row(Collective::all_gather).bus_factor(n) == ring);
        CHECK(collective_row(Collective::reduce_scatter).bus_factor(n) == ring);
        CHECK(collective_row(Collective::all_to_all).bus_factor(n) == ring);
        CHECK(collective_row(Collective::broadcast).bus_factor(n) == 1);
        CHECK(collective_row(Collective::send).bus_factor(n) == 1);
        CHECK(collective_row(Collective::recv).bus_factor(n) == 1);
        CHECK(collective_row(Collective::all_reduce).hops(n) == 2 * (n - 1));
        CHECK(collective_row(Collective::broadcast).hops(n) == n - 1);
        CHECK(collective_row(Collective::all_gather).hops(n) == n - 1);
        CHECK(collective_row(Collective::send).hops(n) == 1);
    }
    CHECK(bus_bytes(Collective::all_reduce, 1024, 4) == 1536);  // 2 x 3/4 x 1 KiB
    CHECK(bus_bytes(Collective::all_gather, 1024, 4) == 768);
    CHECK(bus_bytes(Collective::reduce_scatter, 1024, 8) == 896);
    CHECK(bus_bytes(Collective::all_to_all, 1024, 2) == 512);
    CHECK(bus_bytes(Collective::broadcast, 1024, 8) == 1024);
    CHECK(bus_bytes(Collective::send, 1024, 2) == 1024);
    CHECK(collective_row(Collective::send).p2p);
    CHECK(collective_row(Collective::recv).p2p);
    CHECK(!collective_row(Collective::all_to_all).p2p);
    CHECK(collective_row(Collective::all_gather).counted == CountedTensor::output);
    CHECK(collective_row(Collective::reduce_scatter).counted == CountedTensor::input);
    CHECK(collective_row(Collective::all_reduce).counted == CountedTensor::tensor);
}

TEST_CASE("a counter keys on the collective and lists ops in their names' order", "[cpu]") {
    CommCounter c;
    c.add(Collective::send, "pp", 16);
    c.add(Collective::all_reduce, "dp", 8);
    c.add(Collective::all_gather, "dp", 32);
    c.add(Collective::all_reduce, "dp", 8);
    std::string order;
    for (const auto& [op, t] : c.by_op())
        order += std::string(order.empty() ? "" : ",") + collective_name(op);
    CHECK(order == "all_gather,all_reduce,send");
    CHECK(c.by_op().at(Collective::all_reduce).calls == 2);
    CHECK(c.by_op().at(Collective::all_reduce).bytes == 16);
    CHECK(by_op_dim(c).at({Collective::send, "pp"}).bytes == 16);
}
