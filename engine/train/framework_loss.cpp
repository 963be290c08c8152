#include "train/framework_loss.h"

#include "core/framework_memory.h"

namespace ptool {

FrameworkLoss::FrameworkLoss(RunContext& ctx, LossKind kind, const Tensor& logits)
    : ctx_(ctx), active_(kind == LossKind::cross_entropy && logits.defined()) {
    if (!active_) return;
    shape_ = {logits.numel() / std::max<int64_t>(1, logits.size(-1)), logits.size(-1)};
    dtype_ = logits.dtype();
    own_.emplace(TorchAlloc::ptool_only);
    kernels_.emplace(MetaKernelMode{.on_chip = true});
    meta_count_op(OpClass::cross_entropy, dtype_, static_cast<double>(logits.numel()),
                  framework_kernels(OpClass::cross_entropy, dtype_));
}

FrameworkLoss::~FrameworkLoss() {
    if (!active_) return;
    kernels_.reset(), own_.reset();
    Tensor upcast;  // .float(): a copy unless the logits are float32 already
    if (dtype_ != DType::float32) upcast = torch_only(shape_, DType::float32, MemoryUse::activations);
    ctx_.torch_loss_saved.push_back(
        torch_only(shape_, DType::float32, MemoryUse::activations));  // log_softmax
    torch_release(upcast);
    ctx_.torch_loss_saved.push_back(torch_only({0}, dtype_, MemoryUse::activations));  // the logits' dtype
}

void framework_loss_backward(RunContext& ctx) {
    if (ctx.torch_loss_saved.size() != 2) return;
    const Tensor log_probs = ctx.torch_loss_saved[0];
    const DType dtype = ctx.torch_loss_saved[1].dtype();
    ctx.torch_loss_saved.clear();
    const Shape shape = log_probs.shape();
    Tensor nll = torch_only(shape, DType::float32, MemoryUse::activations);
    Tensor grad = torch_only(shape, DType::float32, MemoryUse::activations);  // log_softmax's backward
    torch_release(nll);
    torch_release(log_probs);
    if (dtype != DType::float32) {
        Tensor cast = torch_only(shape, dtype, MemoryUse::activations);
        torch_release(grad);
        grad = cast;
    }
    ctx.torch_release_after_first_backward.push_back(grad);
}

}  // namespace ptool
