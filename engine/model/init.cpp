// Default parameter init from the counter-based RNG: element i of parameter `fqn` is a function
// of (seed, "init", fqn, i) alone, so a rank can build any shard of it without the rest; it is
// drawn on the tensor's device (Backend::draw_init). A whole tensor drawn is kept in the process's
// DrawnCache: the ranks of a verify copy their boxes of the reference's draw instead of drawing
// them again.
#include <algorithm>

#include "core/device_memory.h"
#include "core/rng.h"
#include "model/drawn_cache.h"
#include "model/layers.h"

namespace ptool {

namespace {

// t = the values InitDraw describes for a shard along `dim` at `offset` of `full`, on t's device
// (Backend::draw_init: the CPU draws on every core, bitwise the serial draw).
void draw_shard(Tensor& t, uint64_t seed, uint64_t stream, bool normal, double scale, const Shape& full,
                int64_t dim, int64_t offset) {
    InitDraw d;
    d.seed = seed, d.stream = stream, d.normal = normal, d.scale = scale, d.offset = offset;
    for (size_t k = static_cast<size_t>(dim) + 1; k < full.size(); ++k) d.inner *= full[k];
    d.full_len = full.empty() ? 1 : full[static_cast<size_t>(dim)];
    d.run = (t.dim() ? t.shape()[static_cast<size_t>(dim)] : 1) * d.inner;
    backend_for(t.device()).draw_init(t, d);
}

void fill_normal_shard(Tensor& t, const CounterRng& rng, double stddev, const Shape& full, int64_t dim,
                       int64_t offset) {
    draw_shard(t, rng.seed(), rng.stream(), true, stddev, full, dim, offset);
}

// t = the box of `whole` along `dim` at `offset` (t's shape elsewhere): the runs draw_shard draws,
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
    init_cached(t, seed, fqn, fmt::format("uniform/{:a}", bound), full, dim, offset,
                [&] { draw_shard(t, seed, stream_id("init", fqn), false, bound, full, dim, offset); });
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
    backend_for(t.device()).fill(t, value);
}

}  // namespace ptool
