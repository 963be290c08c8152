// Default parameter init from the counter-based RNG: element i of parameter `fqn` is a function
// of (seed, "init", fqn, i) alone, so a rank can build any shard of it without the rest. A whole
// tensor drawn is kept in the process's DrawnCache: the ranks of a verify copy their boxes of the
// reference's draw instead of drawing them again.
#include <algorithm>

#include "core/device_memory.h"
#include "core/rng.h"
#include "model/drawn_cache.h"
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

namespace {
// t[i] = f(draw of global index g(i)), where draw(first, n, out) writes n consecutive indices' values
// (uniform_run, normal_run): a shard along `dim` at `offset` of `full` is, for each index of the
// dims before `dim`, one run of the full tensor's indices, drawn 4096 at a time.
template <class Draw, class F>
void fill_runs(Tensor& t, const Shape& full, int64_t dim, int64_t offset, Draw&& draw, F&& f) {
    int64_t inner = 1;
    for (size_t d = dim + 1; d < full.size(); ++d) inner *= full[d];
    const int64_t local_len = t.dim() ? t.shape()[dim] : 1, full_len = full.empty() ? 1 : full[dim];
    const int64_t run = local_len * inner, n = t.numel();
    dispatch_float(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* p = t.data<T>();
        double v[4096];
        for (int64_t outer = 0; run > 0 && outer * run < n; ++outer) {
            const int64_t first = (outer * full_len + offset) * inner;  // the run's first global index
            for (int64_t start = 0; start < run; start += 4096) {
                const int64_t len = std::min<int64_t>(4096, run - start);
                draw(static_cast<uint64_t>(first + start), len, v);
                for (int64_t i = 0; i < len; ++i)
                    p[outer * run + start + i] = T(static_cast<acc_t<T>>(f(v[i])));
            }
        }
    });
}
void fill_normal_shard(Tensor& t, const CounterRng& rng, double stddev, const Shape& full, int64_t dim,
                       int64_t offset) {
    fill_runs(
        t, full, dim, offset, [&](uint64_t first, int64_t n, double* out) { rng.normal_run(first, n, out); },
        [&](double z) { return stddev * z; });
}

// t = the box of `whole` along `dim` at `offset` (t's shape elsewhere): the runs fill_runs draws,
// as rows of a strided copy.
void copy_box(const Tensor& whole, Tensor& t, int64_t dim, int64_t offset) {
    const Shape& full = whole.shape();
    int64_t inner = 1;
    for (size_t d = dim + 1; d < full.size(); ++d) inner *= full[d];
    const size_t es = dtype_size(t.dtype()), full_len = full.empty() ? 1 : full[dim];
    const size_t run = static_cast<size_t>((t.dim() ? t.shape()[dim] : 1) * inner) * es;
    copy_rows(t.raw(), run, t.device(), static_cast<const char*>(whole.raw()) + offset * inner * es,
              full_len * inner * es, whole.device(), run, run ? t.nbytes() / run : 0);
}

// A parameter's initial values: the box of the whole tensor drawn earlier in this process (the
// reference run's, drawn whole), else drawn (runs of the whole tensor's indices); a whole tensor
// drawn is kept for the ranks that follow. `what` names the distribution and its scale.
template <class Fill>
void init_cached(Tensor& t, uint64_t seed, const std::string& fqn, const std::string& what, const Shape& full,
                 int64_t dim, int64_t offset, Fill&& fill) {
    const std::string key =
        fmt::format("init/{}/{}/{}/{}/{}", seed, fqn, what, shape_str(full), dtype_name(t.dtype()));
    if (const Tensor whole = drawn_tensors().find(key); whole.defined())
        return copy_box(whole, t, dim, offset);
    fill();
    if (t.shape() == full) drawn_tensors().keep(key, t);
}
}  // namespace

void init_uniform(Tensor& t, uint64_t seed, const std::string& fqn, double bound) {
    init_uniform_shard(t, seed, fqn, bound, t.shape(), 0, 0);
}

void init_uniform_shard(Tensor& t, uint64_t seed, const std::string& fqn, double bound, const Shape& full,
                        int64_t dim, int64_t offset) {
    init_cached(t, seed, fqn, fmt::format("uniform/{:a}", bound), full, dim, offset, [&] {
        const CounterRng rng(seed, stream_id("init", fqn));
        fill_runs(
            t, full, dim, offset,
            [&](uint64_t first, int64_t n, double* out) { rng.uniform_run(first, n, out); },
            [&](double u) { return -bound + 2.0 * bound * u; });
    });
}

void init_normal_shard(Tensor& t, uint64_t seed, const std::string& fqn, double stddev, const Shape& full,
                       int64_t dim, int64_t offset) {
    init_cached(t, seed, fqn, fmt::format("normal/{:a}", stddev), full, dim, offset, [&] {
        fill_normal_shard(t, CounterRng(seed, stream_id("init", fqn)), stddev, full, dim, offset);
    });
}

void fill_normal(Tensor& t, const CounterRng& rng, double stddev) {
    fill_normal_shard(t, rng, stddev, t.shape(), 0, 0);
}

void init_normal(Tensor& t, uint64_t seed, const std::string& fqn, double stddev) {
    init_normal_shard(t, seed, fqn, stddev, t.shape(), 0, 0);
}

void fill_value(Tensor& t, double value) {
    if (!dtype_is_float(t.dtype())) {
        for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
        return;
    }
    fill_by_index(t, [&](int64_t) { return value; });
}

}  // namespace ptool
