// Default parameter init from the counter-based RNG: element i of parameter `fqn` is a function
// of (seed, "init", fqn, i) alone, so a rank can build any shard of it without the rest.
#include <algorithm>

#include "core/rng.h"
#include "model/layers.h"

namespace ptool {

namespace {
// t[i] = f(global index of i), one dtype dispatch per tensor.
template <class F>
void fill_by_index(Tensor& t, F&& f) {
    dispatch_float(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* p = t.data<T>();
        for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = T(static_cast<acc_t<T>>(f(i)));
    });
}
}  // namespace

void init_uniform(Tensor& t, uint64_t seed, const std::string& fqn, double bound) {
    CounterRng rng(seed, stream_id("init", fqn));
    dispatch_float(t.dtype(), [&](auto tag) {  // fill_by_index's values, drawn 4096 at a time
        using T = decltype(tag);
        T* p = t.data<T>();
        double u[4096];
        for (int64_t start = 0, n = t.numel(); start < n; start += 4096) {
            const int64_t len = std::min<int64_t>(4096, n - start);
            rng.uniform_run(static_cast<uint64_t>(start), len, u);
            for (int64_t i = 0; i < len; ++i) p[start + i] = T(static_cast<acc_t<T>>(-bound + 2.0 * bound * u[i]));
        }
    });
}

namespace {
// The flat index in the full tensor of local element i of a shard along dim starting at offset.
struct ShardIndex {
    int64_t inner = 1, local_len, full_len, offset;
    ShardIndex(const Tensor& t, const Shape& full, int64_t dim, int64_t off)
        : local_len(t.dim() ? t.shape()[dim] : 1), full_len(full[dim]), offset(off) {
        for (size_t d = dim + 1; d < full.size(); ++d) inner *= full[d];
    }
    uint64_t operator()(int64_t i) const {  // local (outer, k, in) -> global (outer, offset + k, in)
        const int64_t in = i % inner, k = (i / inner) % local_len, outer = i / (inner * local_len);
        return static_cast<uint64_t>((outer * full_len + offset + k) * inner + in);
    }
};
}  // namespace

void init_uniform_shard(Tensor& t, uint64_t seed, const std::string& fqn, double bound, const Shape& full, int64_t dim,
                        int64_t offset) {
    CounterRng rng(seed, stream_id("init", fqn));
    const ShardIndex global(t, full, dim, offset);
    fill_by_index(t, [&](int64_t i) { return -bound + 2.0 * bound * rng.uniform(global(i)); });
}

void init_normal_shard(Tensor& t, uint64_t seed, const std::string& fqn, double stddev, const Shape& full, int64_t dim,
                       int64_t offset) {
    CounterRng rng(seed, stream_id("init", fqn));
    const ShardIndex global(t, full, dim, offset);
    fill_by_index(t, [&](int64_t i) { return stddev * rng.normal(global(i)); });
}

void init_normal(Tensor& t, uint64_t seed, const std::string& fqn, double stddev) {
    CounterRng rng(seed, stream_id("init", fqn));
    fill_by_index(t, [&](int64_t i) { return stddev * rng.normal(i); });
}

void fill_value(Tensor& t, double value) {
    if (!dtype_is_float(t.dtype())) {
        for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
        return;
    }
    fill_by_index(t, [&](int64_t) { return value; });
}

}  // namespace ptool
