// Losses on the model output: sum (output.sum(), as PyTorch's parallelism tests), mean, mse,
// cross_entropy (logits [.., V] against class ids [..], ignore_index's rows left out). Returns the
// loss and d(loss)/d(output).
//
// Every loss but sum is a sum over items divided by a count: cross_entropy's items are its valid
// targets, mse's and mean's the output's elements. A call divides by its own count (reduction='mean',
// loss_normalization mean_per_call) or by the step's count over every rank and microbatch
// (global_tokens: LossDivisor::count set by the run, train/run.cpp).
#pragma once

#include <optional>

#include "backend/backend.h"
#include "model/model.h"

namespace ptool {

struct LossResult {
    double value = 0;
    Tensor grad;  // d(loss)/d(output), same shape as the output
};

struct LossDivisor {
    int64_t ignore_index = -100;
    std::optional<double> count;  // nullopt: the call's own items (reduction='mean')
};

LossResult compute_loss(Backend& be, LossKind kind, const Tensor& output, const Tensor& target,
                        const LossDivisor& divisor = {});

// The items a loss divides by in a call on `output` (shape) against `target`: cross_entropy's targets
// that are not ignore_index, mse's and mean's elements; 0 for sum. On meta tensors (no values) every
// target counts.
int64_t loss_items(LossKind kind, const Shape& output, const Tensor& target, int64_t ignore_index);

}  // namespace ptool
