#include "core/tensor_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ptool {

int64_t normalize_dim(int64_t dim, int64_t ndim) {
    const int64_t d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= ndim)
        throw InputError(fmt::format("dim {} is out of range for a {}-d tensor", dim, ndim));
    return d;
}

int64_t first_nonfinite(const Tensor& t) {
    if (!dtype_is_float(t.dtype())) return -1;
    return dispatch_float(t.dtype(), [&](auto tag) -> int64_t {
        using T = decltype(tag);
        const T* p = t.data<T>();
        for (int64_t i = 0, n = t.numel(); i < n; ++i)
            if (!std::isfinite(static_cast<double>(static_cast<acc_t<T>>(p[i])))) return i;
        return -1;
    });
}

Chunk chunk_of(int64_t n, int parts, int index) {
    const int64_t size = (n + parts - 1) / parts;
    const int64_t begin = std::min<int64_t>(n, size * index);
    return {begin, std::min<int64_t>(n, begin + size) - begin};
}

namespace {

// t's shape as [P, M, Q] around dim: the elements before it, along it, after it.
struct AroundDim {
    int64_t outer = 1, along = 1, inner = 1;
};
AroundDim around_dim(const Shape& shape, int64_t dim) {
    AroundDim a;
    for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i)
        (i < dim ? a.outer : i == dim ? a.along : a.inner) *= shape[i];
    return a;
}

// Between the tensor [P, M, Q] and its packed chunks [M, P * Q], one direction or the other.
void copy_chunks(const AroundDim& a, int parts, size_t es, Device device, const char* src, char* dst,
                 bool pack) {
    for (int r = 0; r < parts; ++r) {
        const Chunk c = chunk_of(a.along, parts, r);
        if (c.length == 0 || a.outer * a.inner == 0) continue;
        const size_t width = static_cast<size_t>(c.length * a.inner) * es,
                     full_row = static_cast<size_t>(a.along * a.inner) * es;
        const size_t at_full = static_cast<size_t>(c.offset * a.inner) * es;
        const size_t at_packed = static_cast<size_t>(c.offset * a.outer * a.inner) * es;
        if (pack)
            copy_rows(dst + at_packed, width, device, src + at_full, full_row, device, width, a.outer);
        else
            copy_rows(dst + at_full, full_row, device, src + at_packed, width, device, width, a.outer);
    }
}

}  // namespace

Tensor pack_chunks(const Tensor& t, int parts, int64_t dim) {
    dim = normalize_dim(dim, t.dim());
    const AroundDim a = around_dim(t.shape(), dim);
    Tensor out = Tensor::empty({a.along, a.outer * a.inner}, t.dtype(), t.device());
    if (t.device() == Device::meta) return out;  // no bytes to move
    copy_chunks(a, parts, dtype_size(t.dtype()), t.device(), static_cast<const char*>(t.raw()),
                static_cast<char*>(out.raw()), true);
    return out;
}

Tensor unpack_chunks(const Tensor& packed, const Shape& shape, int parts, int64_t dim) {
    dim = normalize_dim(dim, static_cast<int64_t>(shape.size()));
    const AroundDim a = around_dim(shape, dim);
    PTOOL_REQUIRE(packed.numel() == a.outer * a.along * a.inner, "unpack_chunks: {} elements for shape {}",
                  packed.numel(), shape_str(shape));
    Tensor out = Tensor::empty(shape, packed.dtype(), packed.device());
    if (packed.device() == Device::meta) return out;
    copy_chunks(a, parts, dtype_size(packed.dtype()), packed.device(), static_cast<const char*>(packed.raw()),
                static_cast<char*>(out.raw()), false);
    return out;
}

Tensor cat(const std::vector<Tensor>& pieces, int64_t dim) {
    PTOOL_REQUIRE(!pieces.empty(), "cat of nothing");
    const Tensor& first = pieces[0];
    dim = normalize_dim(dim, first.dim());
    Shape shape = first.shape();
    shape[dim] = 0;
    for (const Tensor& p : pieces) {
        PTOOL_REQUIRE(p.dim() == first.dim() && p.dtype() == first.dtype(), "cat: pieces differ");
        shape[dim] += p.shape()[dim];
    }
    Tensor out = Tensor::empty(shape, first.dtype(), first.device());
    if (out.device() == Device::meta) return out;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
    for (int64_t d = dim + 1; d < first.dim(); ++d) inner *= shape[d];
    const size_t es = dtype_size(first.dtype());
    const size_t out_row = static_cast<size_t>(shape[dim] * inner) * es;
    char* dst = static_cast<char*>(out.raw());
    for (const Tensor& p : pieces) {  // each piece is `outer` rows of its own width in out's rows
        PTOOL_REQUIRE(p.device() == first.device(), "cat: pieces on different devices");
        const size_t bytes = static_cast<size_t>(p.shape()[dim] * inner) * es;
        if (bytes && outer) copy_rows(dst, out_row, out.device(), p.raw(), bytes, p.device(), bytes, outer);
        dst += bytes;
    }
    return out;
}

Tensor chunk(const Tensor& t, int parts, int index, int64_t dim) {
    dim = normalize_dim(dim, t.dim());
    const Chunk c = chunk_of(t.shape()[dim], parts, index);
    Tensor piece = t.narrow(dim, c.offset, c.length);
    return piece.shares_storage(t) ? piece.clone() : piece;
}

}  // namespace ptool
