// Shape checks shared by every backend's entry points, so the CPU and CUDA backends accept and
// reject the same inputs with the same messages (host code, unit-tested everywhere).
#pragma once

#include "core/tensor.h"

namespace ptool {

void require_same_shape(const Tensor& a, const Tensor& b, const char* op);
void require_same_dtype(const Tensor& a, const Tensor& b, const char* op);

// c = op(a) @ op(b): a [batch.., M, K], b [batch.., K, N] or 2-D (shared), c [batch.., M, N].
struct GemmDims {
    int64_t batch, m, n, k;
    bool b_shared;  // b is 2-D: one matrix for every batch
};
GemmDims gemm_dims(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c);

// Rows of a tensor reduced over its last dim (norms, softmax, losses): {rows, cols}.
struct RowDims {
    int64_t rows, cols;
};
RowDims row_dims(const Tensor& x);

}  // namespace ptool
