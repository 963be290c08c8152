// Tensor comparison with torch.testing.assert_close's rule: |a - e| <= atol + rtol * |e|,
// defaults per dtype (fp32 1.3e-6/1e-5, bf16 1.6e-2/1e-5, fp16 1e-3/1e-5, fp64 1e-7/1e-7),
// NaN never equal (equal_nan=False). Also reports ULP distance in the tensors' dtype and the
// headroom: the worst |a - e| / (atol + rtol * |e|), < 1 passes.
//
// Low precision (bfloat16, float16): a TP run's rowwise partial sums are rounded on each rank
// before the reduction, so where cancellation leaves near-zero elements the elementwise rule fails
// a correct plan. With the dtype's default tolerance, a tensor there also passes when its relative
// Frobenius error ||a - e|| / ||e|| is within DESIGN §6's bound k * C^depth * eps(dtype) (k = 4,
// C = 1.03, TTrace, arXiv 2506.09280); depth is the model's leaf-module count, which bounds every
// tensor's distance from the output. A wrong shard or a missing reduction is off by O(1).
// A parameter's gradient (or value) is measured against its module's: all of the module's
// parameters flattened, as a DDP bucket holds them (compare_runs). So a gradient that is zero in
// exact arithmetic (attention's key bias: softmax ignores a shift shared by every key) is judged
// by the noise it carries against the module's gradient, not by noise over noise.
#pragma once

#include "core/tensor.h"

namespace ptool {

struct Tolerance {
    double rtol = 1.3e-6, atol = 1e-5;
    double rel_fro = 0;  // > 0: a tensor whose relative Frobenius error is within it passes too
};
// torch.testing's rtol/atol for the dtype; for bfloat16/float16 also the relative Frobenius bound
// at `depth` (0 for the other dtypes).
Tolerance default_tolerance(DType dt, int depth = 1);
double frobenius_bound(DType dt, int depth);  // k * C^depth * eps(dtype)

struct TensorDiff {
    bool shape_ok = true;
    double max_abs = 0, max_rel = 0, headroom = 0;
    double rel_fro = 0;       // ||a - e||_F / ||e||_F (inf when e is zero and a is not)
    double err_norm = 0, ref_norm = 0;  // ||a - e||_F and ||e||_F (ref_norm 0 for bitwise-equal tensors without rel_fro)
    bool by_frobenius = false;  // failed the elementwise rule, passed by the Frobenius bound
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
