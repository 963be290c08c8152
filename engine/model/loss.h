// Losses on the model output: sum (output.sum(), as PyTorch's parallelism tests), mean, mse,
// cross_entropy (logits [.., V] against class ids [..]). Returns the loss and d(loss)/d(output).
#pragma once

#include "backend/backend.h"
#include "model/model.h"

namespace ptool {

struct LossResult {
    double value = 0;
    Tensor grad;  // d(loss)/d(output), same shape as the output
};

LossResult compute_loss(Backend& be, LossKind kind, const Tensor& output, const Tensor& target);

}  // namespace ptool
