#include "backend/op_shapes.h"

namespace ptool {

void require_same_shape(const Tensor& a, const Tensor& b, const char* op) {
    PTOOL_REQUIRE(a.shape() == b.shape(), "{}: shapes {} and {} differ", op, shape_str(a.shape()),
                  shape_str(b.shape()));
}

void require_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
    PTOOL_REQUIRE(a.dtype() == b.dtype(), "{}: dtypes {} and {} differ", op, dtype_name(a.dtype()),
                  dtype_name(b.dtype()));
}

GemmDims gemm_dims(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
    PTOOL_REQUIRE(a.dim() >= 2 && b.dim() >= 2 && c.dim() >= 2, "gemm needs matrices: {} {} {}",
                  shape_str(a.shape()), shape_str(b.shape()), shape_str(c.shape()));
    GemmDims d{};
    d.m = ta ? a.size(-1) : a.size(-2);
    d.k = ta ? a.size(-2) : a.size(-1);
    int64_t kb = tb ? b.size(-1) : b.size(-2);
    d.n = tb ? b.size(-2) : b.size(-1);
    d.batch = 1;  // the leading dims of c (a's may hold no elements when k == 0)
    for (int64_t i = 0; i + 2 < c.dim(); ++i) d.batch *= c.shape()[i];
    d.b_shared = b.dim() == 2 && d.batch != 1;
    PTOOL_REQUIRE(kb == d.k && c.size(-2) == d.m && c.size(-1) == d.n,
                  "gemm shapes do not agree: a {}{} b {}{} c {}", shape_str(a.shape()), ta ? "^T" : "",
                  shape_str(b.shape()), tb ? "^T" : "", shape_str(c.shape()));
    PTOOL_REQUIRE(a.numel() == d.batch * d.m * d.k && (d.b_shared || b.numel() == d.batch * d.k * d.n),
                  "gemm batch sizes do not agree: a {} b {} c {}", shape_str(a.shape()), shape_str(b.shape()),
                  shape_str(c.shape()));
    return d;
}

RowDims row_dims(const Tensor& x) {
    const int64_t cols = x.dim() ? x.size(-1) : 1;
    return {cols == 0 ? 0 : x.numel() / cols, cols};
}

}  // namespace ptool
