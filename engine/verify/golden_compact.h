// Compact goldens (`ptool golden record --compact [--sample N]`): for models whose full goldens
// would be large. Per step the loss (and clip_grad_norm's norm) whole; for the output and every
// gradient, parameter and buffer, its Frobenius norm (`NAME.norm`, float64 [1]) and N of its
// elements (`NAME.sample`, float64, at flat indices floor(j * numel / N), j < min(N, numel)).
// No init and no data: a compact case replays ptool's own seeded init and generated batch, so
// it cannot be recorded from --init or --data. metadata "compact_sample" = N.
//
// Replayed, the reference's tensors are compared with them: the loss by the elementwise rule (a
// loss of the outputs themselves also allowed what outputs that pass elementwise can make of it,
// bounded from their norm: golden_compact.cpp); a
// norm passes when |‖a‖ - ‖e‖| <= atol * sqrt(numel) + rtol * ‖e‖ (what the elementwise rule
// implies, so no run that passes a full golden fails its compact one); the sample elementwise.
// What it cannot catch: a change confined to elements outside the sample that moves no norm
// beyond that bound (one wrong element of a large tensor, a permutation), and AdamW updates are
// judged elementwise only (the file has no gradients to re-apply the optimizer to).
#pragma once

#include "core/safetensors.h"
#include "verify/report.h"

namespace ptool {

TensorFile compact_golden(const TensorFile& full, int64_t sample);
bool is_compact(const TensorFile& golden);
// The flat indices a sample of n elements takes from `numel`.
std::vector<int64_t> sample_indices(int64_t numel, int64_t n);
// One report row per compacted golden key: the run's tensors (full, as the reference records)
// against the golden's norms, samples and losses.
PlanReport compare_with_compact(const RunRecord& run, const TensorFile& golden, const Tolerance& tol,
                                const std::string& label);

}  // namespace ptool
