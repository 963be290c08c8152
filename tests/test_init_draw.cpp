// Parameter initialisation drawn on every core (model/init.cpp) against the serial draw it replaced:
// element by element, the value of its global index from one CounterRng in order, bitwise, on sizes
// that cut the jobs and runs unevenly and on shards along every dim.
#include <cmath>
#include <cstring>
#include <string>

#include "core/rng.h"
#include "model/layers.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_init_draw {

namespace {

// What the serial draw wrote at local element i of a shard of `full` along `dim` at `offset`:
// f(value of the global index), rounded once to t's dtype.
template <class F>
Tensor serial_shard(const Shape& local, DType dt, const Shape& full, int64_t dim, int64_t offset, F&& f) {
    Tensor t(local, dt);
    int64_t inner = 1;
    for (size_t d = static_cast<size_t>(dim) + 1; d < full.size(); ++d) inner *= full[d];
    const int64_t run = (local.empty() ? 1 : local[static_cast<size_t>(dim)]) * inner,
                  full_len = full.empty() ? 1 : full[static_cast<size_t>(dim)];
    for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t g = (i / run * full_len + offset) * inner + i % run;
        const double v = f(static_cast<uint64_t>(g));
        if (dt == DType::float64)
            t.data<double>()[i] = v;
        else if (dt == DType::float32)
            t.data<float>()[i] = static_cast<float>(v);
        else
            t.data<bf16_t>()[i] = bf16_t(static_cast<float>(v));
    }
    return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct ShardCase {
    Shape full;
    int64_t dim, offset, length;  // the local shard along dim
};

}  // namespace

TEST_CASE("init drawn on every core is bitwise the serial draw, whole and sharded", "[cpu]") {
    // 2^18 elements a job: these cut jobs inside runs, runs inside jobs, and leave odd tails
    const ShardCase cases[] = {
        {{1000003}, 0, 0, 1000003},      // whole, odd, four jobs
        {{1000003}, 0, 333333, 333335},  // a 1-D shard at an odd offset
        {{517, 1031}, 0, 0, 517},        // whole 2-D
        {{517, 1031}, 1, 401, 513},      // a column shard: 517 runs of 513
        {{777, 1033}, 0, 259, 259},      // a row shard
        {{3, 1025, 171}, 1, 17, 611},    // dims before and after the shard's
        {{7}, 0, 0, 7},                  // one short job
    };
    const uint64_t seed = 20261128;
    int n = 0;
    for (const ShardCase& c : cases)
        for (DType dt : {DType::float32, DType::float64, DType::bfloat16}) {
            Shape local = c.full;
            local[static_cast<size_t>(c.dim)] = c.length;
            // names unique per case: nothing comes from the process's cache of drawn tensors
            const std::string fqn = fmt::format("draw{}.weight", n++);
            const CounterRng rng(seed, stream_id("init", fqn));
            const double bound = 0.0625, stddev = 0.02;
            Tensor u(local, dt), z(local, dt);
            init_uniform_shard(u, seed, fqn, bound, c.full, c.dim, c.offset);
            init_normal_shard(z, seed, fqn, stddev, c.full, c.dim, c.offset);
            INFO(shape_str(c.full) << " dim " << c.dim << " at " << c.offset << " x " << c.length << " "
                                   << dtype_name(dt));
            CHECK(bitwise_equal(u, serial_shard(local, dt, c.full, c.dim, c.offset, [&](uint64_t g) {
                                    return -bound + 2.0 * bound * rng.uniform(g);
                                })));
            CHECK(bitwise_equal(z, serial_shard(local, dt, c.full, c.dim, c.offset,
                                                [&](uint64_t g) { return stddev * rng.normal(g); })));
        }
}

TEST_CASE("the bitwise comparison of a draw sees one ulp in one element", "[cpu]") {
    const Shape full{1000003};
    Tensor u(full, DType::float32);
    init_uniform_shard(u, 5, "tamper.weight", 1.0, full, 0, 0);
    const CounterRng rng(5, stream_id("init", "tamper.weight"));
    const Tensor expected = serial_shard(full, DType::float32, full, 0, 0,
                                         [&](uint64_t g) { return -1.0 + 2.0 * rng.uniform(g); });
    CHECK(bitwise_equal(u, expected));
    u.data<float>()[786431] = std::nextafter(u.data<float>()[786431], 2.0f);  // one ulp, in the third job
    CHECK_FALSE(bitwise_equal(u, expected));
}

}  // namespace test_init_draw
