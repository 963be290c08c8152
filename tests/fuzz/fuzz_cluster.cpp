// libFuzzer harness: the cluster file loader (plan/cluster.h) and the time model's use of it. Any
// input must load or throw InputError; a cluster that loads has finite, bounded numbers, so the
// step time of a small plan on it is finite too. Anything else is a finding. Seeded with
// clusters/*.yaml. See scripts/fuzz.sh.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "plan/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    ptool::Cluster c;
    try {
        c = ptool::load_cluster_text(std::string(reinterpret_cast<const char*>(data), size), "cluster.yaml");
    } catch (const ptool::InputError&) {
        return 0;
    }
    const double numbers[] = {c.memory_bytes,    c.reserved_bytes, c.gemm_efficiency, c.memory_bandwidth,
                              c.intra.bandwidth, c.intra.latency,  c.inter.bandwidth, c.inter.latency};
    for (double v : numbers)
        if (!std::isfinite(v) || v < 0 || v > 1e30)
            std::fprintf(stderr, "a loaded cluster holds %g\n", v), std::abort();
    for (const auto& [dt, f] : c.flops)
        if (!std::isfinite(f) || f <= 0 || f > 1e30)
            std::fprintf(stderr, "a loaded cluster's flops %g\n", f), std::abort();
    if (c.world_size() <= 0 || c.reserved_bytes >= c.memory_bytes)
        std::fprintf(stderr, "a loaded cluster's sizes\n"), std::abort();
    return 0;
}
