// What a step's data makes a correct plan's loss differ from the reference's, said before it runs.
//
// Under loss_normalization mean_per_call every forward call divides by its own valid targets. Where
// the data ranks' and cp ranks' pieces of one microbatch hold different counts (targets masked
// unevenly: prompts and padding), the average of their means is not the microbatch's mean over its
// valid targets, so the parallel run trains another model than one device does (the bug
// torchtitan's global_valid_tokens and transformers' num_items_in_batch fixed): the cause names the
// counts and the fix. A piece with no valid target computes PyTorch's 0 / 0 = NaN.
#pragma once

#include <vector>

#include "core/diagnostic.h"
#include "model/batch.h"
#include "parallel/plan.h"
#include "train/run.h"

namespace ptool {

// The valid targets of step `step`'s batch per microbatch, data rank and cp rank:
// counts[m][d * cp + c] (the rows and positions a Run gives that rank).
std::vector<std::vector<int64_t>> valid_target_counts(const Model& model, const Plan& plan,
                                                      const Batch& batch);

// The causes for `steps` steps of `data` (its first step only when it does not vary per step).
// InputError (exit 2) when a step's batch has no valid target at all: its loss would be a mean over
// nothing (PyTorch's NaN) under either normalisation, and nothing of it could be compared; and under
// mean_per_call when one of its microbatches has none (that call's loss is 0 / 0 = NaN, its
// gradients zero, as PyTorch's: the step's loss is NaN in both runs).
std::vector<Diagnostic> loss_normalization_causes(const Model& model, const Plan& plan,
                                                  const DataSource& data, int64_t steps,
                                                  const SourceLocation& data_where);

// Where a step's targets come from, for those refusals: the --data file, else the model's
// masked_targets, else the model.
SourceLocation targets_where(const Model& model, const RunInputs& in);

// The refusal of every command that trains or records the model's steps (run, golden record, shrink
// and plan --verify for the real model before any proxy is written; verify takes it with its causes):
// loss_normalization_causes's InputError, the causes dropped. Draws nothing where no target can be
// ignore_index (no --data, no masked_targets, an ignore_index outside the drawn class ids).
void require_valid_targets(const Model& model, const Plan& plan, const RunInputs& in, int64_t steps);

}  // namespace ptool
