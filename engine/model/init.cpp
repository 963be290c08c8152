// Default parameter init from the counter-based RNG: element i of parameter `fqn` is a function
// of (seed, "init", fqn, i) alone, so a rank can build any shard of it without the rest.
#include "core/rng.h"
#include "model/layers.h"

namespace ptool {

void init_uniform(Tensor& t, uint64_t seed, const std::string& fqn, double bound) {
    CounterRng rng(seed, stream_id("init", fqn));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, -bound + 2.0 * bound * rng.uniform(i));
}

void init_normal(Tensor& t, uint64_t seed, const std::string& fqn, double stddev) {
    CounterRng rng(seed, stream_id("init", fqn));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, stddev * rng.normal(i));
}

void fill_value(Tensor& t, double value) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
}

}  // namespace ptool
