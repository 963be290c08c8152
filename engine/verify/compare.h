// Tensor comparison with torch.testing.assert_close's rule: |a - e| <= atol + rtol * |e|,
// defaults per dtype (fp32 1.3e-6/1e-5, bf16 1.6e-2/1e-5, fp16 1e-3/1e-5, fp64 1e-7/1e-7),
// NaN never equal (equal_nan=False). Also reports ULP distance in the tensors' dtype and the
// headroom: the worst |a - e| / (atol + rtol * |e|), < 1 passes.
#pragma once

#include "core/tensor.h"

namespace ptool {

struct Tolerance {
    double rtol = 1.3e-6, atol = 1e-5;
};
Tolerance default_tolerance(DType dt);

struct TensorDiff {
    bool shape_ok = true;
    double max_abs = 0, max_rel = 0, headroom = 0;
    int64_t max_ulp = 0;
    bool pass = true;
};

TensorDiff compare_tensors(const Tensor& actual, const Tensor& expected, const Tolerance& tol);
bool bitwise_equal(const Tensor& a, const Tensor& b);

// A 64-bit digest of a host tensor's dtype, shape and bytes (multiply-xorshift mixing in four
// lanes of 8 bytes): replicas and construction-time state are compared by digest, so checking a 32 MiB
// gradient moves 8 bytes per rank, not 32 MiB. Equal digests stand for bitwise equality (a
// collision between two different tensors has probability about 2^-64).
uint64_t tensor_digest(const Tensor& t);

}  // namespace ptool
