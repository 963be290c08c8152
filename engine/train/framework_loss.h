// The loss as PyTorch's training loops run it, for the framework tally (core/framework_memory.h)
// and the time model: cross entropy over logits upcast to float32 (transformers' ForCausalLMLoss,
// torchtitan's cross_entropy(pred.float())). ptool computes the loss and its gradient in one call
// on a float32 copy of the output; PyTorch keeps, per microbatch:
//   forward    the upcast (float32 [rows, vocab]), freed once log_softmax's output (float32,
//              saved for its backward) exists
//   backward   nll_loss's gradient (float32, zero-filled), log_softmax's input gradient (float32),
//              then the gradient cast back to the logits' dtype, which lives until the output
//              layer's backward has consumed it
// The kernels of both are counted as one framework op (OpClass::cross_entropy): the table's
// measured loss, or its derived kernel sequence.
#pragma once

#include <optional>

#include "backend/meta/meta_backend.h"
#include "core/memory_account.h"
#include "model/model.h"
#include "model/module.h"

namespace ptool {

// In scope around ptool's loss of `logits` (its upcast copy, the loss's gradient and the cast back):
// those are ptool's stand-ins and its kernels are counted as the framework's; at its end the
// framework's forward tensors go into ctx. Does nothing for a loss other than cross entropy.
class FrameworkLoss {
public:
    FrameworkLoss(RunContext& ctx, LossKind kind, const Tensor& logits);
    ~FrameworkLoss();
    FrameworkLoss(const FrameworkLoss&) = delete;
    FrameworkLoss& operator=(const FrameworkLoss&) = delete;

private:
    RunContext& ctx_;
    bool active_;
    Shape shape_;
    DType dtype_;
    std::optional<TorchAllocScope> own_;
    std::optional<MetaKernelScope> kernels_;
};

// The framework loss's backward at the start of the microbatch's backward (no-op without one).
void framework_loss_backward(RunContext& ctx);

}  // namespace ptool
