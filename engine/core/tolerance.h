// Comparison tolerance, torch.testing.assert_close's rule: |a - e| <= atol + rtol * |e|, with its
// defaults per dtype (fp32 1.3e-6/1e-5, bf16 1.6e-2/1e-5, fp16 1e-3/1e-5, fp64 1e-7/1e-7).
//
// Low precision (bfloat16, float16): a TP run's rowwise partial sums are rounded on each rank
// before the reduction, so where cancellation leaves near-zero elements the elementwise rule fails
// a correct plan. With the dtype's default tolerance, a tensor there also passes when its relative
// Frobenius error ||a - e|| / ||e|| is within k * C^depth * eps(dtype) (k = 4, C = 1.03, TTrace,
// arXiv 2506.09280); depth is the model's leaf-module count, which bounds every tensor's distance
// from the output (docs/architecture.md, Verdicts).
#pragma once

#include <optional>

#include "core/dtype.h"

namespace ptool {

struct Tolerance {
    double rtol = 1.3e-6, atol = 1e-5;
    double rel_fro = 0;  // > 0: a tensor whose relative Frobenius error is within it passes too

    // torch.testing's rtol/atol for the dtype; for bfloat16/float16 also the Frobenius bound at `depth`.
    static Tolerance for_dtype(DType dt, int depth = 1);

    // A tolerance someone asked for (the plan's `verify.tolerance`, --rtol/--atol, a golden's
    // metadata): each value set replaces the default, and asking for one turns the Frobenius rule
    // off (the elementwise rule alone).
    struct Override {
        std::optional<double> rtol, atol;
        bool empty() const { return !rtol && !atol; }
    };
    Tolerance with(const Override& o) const;
};

double frobenius_bound(DType dt, int depth);  // k * C^depth * eps(dtype)

}  // namespace ptool
