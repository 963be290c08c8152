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
    // > 0 (float32, float64): a parameter gradient of the parallel run fails, though every element
    // passes, when its error's Frobenius norm exceeds this fraction of the norm of its module's
    // gradients: the same kernels summing in another order do not reach that far (1024 eps; at most
    // 2.3e-6 measured in float32 over the shipped cases, docs/architecture.md), and an error in one
    // rank's gradient (0.1% of a shard) does, where atol hides it in gradients below 1e-2. Not
    // applied against goldens (other kernels may part by more: judged elementwise there).
    double systematic = 0;
    // Mixed precision: the parameters the optimizer steps are full-precision masters, judged by
    // their dtype's rule (and the update rule, verify/report.h); every other tensor was computed in
    // the compute dtype and is judged by its rule (above). Unset: one rule for all.
    struct Pair {
        double rtol, atol;
    };
    std::optional<Pair> masters;
    // A loss that sums or averages the model's outputs (loss: sum, mean) is judged with them: it
    // passes where it parts from the expected one by no more than atol + rtol |e| plus what its
    // outputs' difference makes of it (|sum(a - e)|, or over their count: verify/report.h,
    // judge_loss_by_outputs). Judged by |e| alone, such a loss near zero (signed outputs that
    // cancel) failed a correct bf16 plan whose every output agreed. none: the loss is judged as any
    // tensor (its terms are not negative: cross-entropy, mse).
    enum class OutputSum { none, sum, mean } loss_of_outputs = OutputSum::none;
    double output_eps = 0;    // the eps of the dtype the outputs and the loss's partials are computed in
    bool signed_sum = false;  // also sum a - e exactly (TensorDiff::signed_err): the outputs' rule
    // The model clips its gradients (clip_grad_norm): each run scales every gradient by its own
    // norm's coefficient, so where the norms part every gradient parts by the same factor. A
    // gradient's comparison then also sums e (a - e) (TensorDiff::projection: `projected`, set by
    // verify/compare.h's rule_for), so that localisation tells that common factor from an error of
    // the gradient's own (verify/report.cpp, localise). clip_max_norm is the model's max_norm (0:
    // it does not clip); with it each step's grad_norm is also compared with signed_sum, so that
    // both runs' norms, and so the factor between their clip coefficients, are known exactly.
    double clip_max_norm = 0;
    bool projected = false;

    // torch.testing's rtol/atol for the dtype; for bfloat16/float16 also the Frobenius bound at `depth`.
    static Tolerance for_dtype(DType dt, int depth = 1);
    // Mixed precision: the compute dtype's rule, and the masters' own where compute is coarser.
    static Tolerance for_policy(DType master, DType compute, int depth = 1);
    // The rule for the masters (the parameters after each step).
    Tolerance for_masters() const;

    // A tolerance someone asked for (the plan's `verify.tolerance`, --rtol/--atol, a golden's
    // metadata): each value set replaces the default, and asking for one turns the Frobenius rules
    // off (the elementwise rule alone) unless rel_fro is given too (a golden records the rule it
    // was recorded with). The masters' follow rtol/atol unless set themselves. Asking for exactly
    // the rule in force (a golden recorded with the defaults) changes nothing.
    struct Override {
        std::optional<double> rtol, atol, master_rtol, master_atol, rel_fro;
        bool empty() const { return !rtol && !atol && !master_rtol && !master_atol && !rel_fro; }
    };
    Tolerance with(const Override& o) const;
};

double frobenius_bound(DType dt, int depth);  // k * C^depth * eps(dtype)

}  // namespace ptool
