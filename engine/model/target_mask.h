// Masked targets, as fine-tuning masks them: the prompt's tokens and the padding carry ignore_index
// (model.h's TargetMaskSpec, the model's batch.masked_targets). Only generated targets are masked: a
// --data file's targets are used as they are (their ignore_index entries are the mask).
#pragma once

#include "core/tensor.h"
#include "model/model.h"

namespace ptool {

// Sets the masked entries of `target` (int64 class ids; dim 1 the sequence where the spec has a prompt
// or padding) to `ignore_index`, drawn from the counter-based RNG keyed by (seed, "data",
// "target_mask"): row r's prompt length from index 2r, its padding from 2r + 1, element i's draw
// against `fraction` from 2 x rows + i.
void apply_target_mask(Tensor& target, const TargetMaskSpec& spec, int64_t ignore_index, uint64_t seed);

// The number of targets that are not ignore_index.
int64_t valid_targets(const Tensor& target, int64_t ignore_index);

}  // namespace ptool
