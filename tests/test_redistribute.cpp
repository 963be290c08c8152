// Shards along any dim: pack_chunks / unpack_chunks against torch.chunk, and redistribute's
// Shard(d) -> Replicate (all_gather) and Partial -> Shard(d) (reduce_scatter) on rank threads,
// with chunks that do not divide evenly (torch.chunk's shorter and empty last pieces).
#include <cstring>

#include "comm/comm_threads.h"
#include "core/tensor_ops.h"
#include "parallel/redistribute.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_redistribute {

namespace {

Tensor counting(const Shape& shape, double scale = 1.0) {
    Tensor t(shape, DType::float32);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, scale * static_cast<double>(i + 1));
    return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

const std::vector<Shape> shapes = {{5, 7, 3}, {4, 6}, {7}, {2, 3, 1, 5}};

}  // namespace

TEST_CASE("pack_chunks lays chunk r out as torch.chunk does, in rows chunk_of(size, parts, r)", "[cpu]") {
    for (const Shape& shape : shapes)
        for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
            for (int parts = 1; parts <= 5; ++parts) {
                INFO("shape " << shape_str(shape) << " dim " << d << " parts " << parts);
                const Tensor t = counting(shape);
                const Tensor packed = pack_chunks(t, parts, d);
                REQUIRE(packed.shape() == Shape{shape[d], t.numel() / shape[d]});
                for (int r = 0; r < parts; ++r) {
                    const Chunk c = chunk_of(shape[d], parts, r);
                    const Tensor expected = chunk(t, parts, r, d);
                    REQUIRE(expected.numel() == c.length * packed.size(1));
                    CHECK(std::memcmp(packed.narrow(0, c.offset, c.length).raw(), expected.raw(),
                                      expected.nbytes()) == 0);
                }
                CHECK(same_bytes(unpack_chunks(packed, shape, parts, d), t));
            }
}

TEST_CASE("redistribute gathers and reduce-scatters shards of any dim, uneven chunks included", "[cpu]") {
    for (const Shape& shape : shapes)
        for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
            for (int n = 1; n <= 5; ++n) {
                INFO("shape " << shape_str(shape) << " dim " << d << " world size " << n);
                const Tensor full = counting(shape);
                Tensor sum = counting(shape, n * (n + 1) / 2.0);  // rank r holds (r + 1) * full
                std::vector<int> gathered(n, 0), scattered(n, 0);
                run_rank_threads(n, CommOptions{}, [&](Communicator& c) {
                    const Tensor local = chunk(full, n, c.rank(), d);
                    gathered[c.rank()] = same_bytes(full_tensor(local, Placement::shard(d), shape, c), full);
                    const Tensor summand = counting(shape, c.rank() + 1.0);
                    const Tensor mine =
                        redistribute(summand, Placement::partial(), Placement::shard(d), shape, c);
                    scattered[c.rank()] = same_bytes(mine, chunk(sum, n, c.rank(), d));
                });
                for (int r = 0; r < n; ++r) {
                    CHECK(gathered[r] == 1);
                    CHECK(scattered[r] == 1);
                }
            }
}

}  // namespace test_redistribute
