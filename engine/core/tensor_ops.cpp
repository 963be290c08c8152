#include "core/tensor_ops.h"

#include <cstring>

namespace ptool {

int64_t normalize_dim(int64_t dim, int64_t ndim) {
    const int64_t d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= ndim) throw InputError(fmt::format("dim {} is out of range for a {}-d tensor", dim, ndim));
    return d;
}

Tensor movedim(const Tensor& t, int64_t from, int64_t to) {
    from = normalize_dim(from, t.dim());
    to = normalize_dim(to, t.dim());
    if (from == to) return t;
    if (t.device() != Device::cpu) return movedim(t.to_device(Device::cpu), from, to).to_device(t.device());
    std::vector<int64_t> order;  // order[i] = source dim of output dim i
    for (int64_t d = 0; d < t.dim(); ++d)
        if (d != from) order.push_back(d);
    order.insert(order.begin() + to, from);
    Shape out_shape;
    for (int64_t d : order) out_shape.push_back(t.shape()[d]);
    Tensor out = Tensor::empty(out_shape, t.dtype(), t.device());
    std::vector<int64_t> src_stride(t.dim(), 1);
    for (int64_t d = t.dim() - 2; d >= 0; --d) src_stride[d] = src_stride[d + 1] * t.shape()[d + 1];
    const size_t es = dtype_size(t.dtype());
    const char* src = static_cast<const char*>(t.raw());
    char* dst = static_cast<char*>(out.raw());
    std::vector<int64_t> idx(t.dim(), 0);
    for (int64_t i = 0, n = out.numel(); i < n; ++i) {
        int64_t off = 0;
        for (int64_t d = 0; d < t.dim(); ++d) off += idx[d] * src_stride[order[d]];
        std::memcpy(dst + i * es, src + off * es, es);
        for (int64_t d = t.dim() - 1; d >= 0; --d) {
            if (++idx[d] < out_shape[d]) break;
            idx[d] = 0;
        }
    }
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
    const int64_t n = t.shape()[dim], size = (n + parts - 1) / parts;
    const int64_t begin = std::min<int64_t>(n, size * index), end = std::min<int64_t>(n, begin + size);
    Tensor piece = t.narrow(dim, begin, end - begin);
    return piece.shares_storage(t) ? piece.clone() : piece;
}

}  // namespace ptool
