#include "model/loss.h"

#include "model/target_mask.h"

namespace ptool {

int64_t loss_items(LossKind kind, const Shape& output, const Tensor& target, int64_t ignore_index) {
    switch (kind) {
        case LossKind::sum:
            return 0;
        case LossKind::mean:
        case LossKind::mse:
            return numel_of(output);
        case LossKind::cross_entropy:
            return target.device() == Device::meta ? target.numel() : valid_targets(target, ignore_index);
    }
    return 0;
}

LossResult compute_loss(Backend& be, LossKind kind, const Tensor& output, const Tensor& target,
                        const LossDivisor& divisor) {
    LossResult r;
    r.grad = empty_like(output);
    const double n =
        divisor.count ? *divisor.count
                      : static_cast<double>(loss_items(kind, output.shape(), target, divisor.ignore_index));
    switch (kind) {
        case LossKind::sum:
            r.value = be.sum_all(output);
            be.fill(r.grad, 1.0);
            break;
        case LossKind::mean:
            r.value = be.sum_all(output) / n;
            be.fill(r.grad, 1.0 / n);
            break;
        case LossKind::mse:
            r.value = be.mse(output, target, n, r.grad);
            break;
        case LossKind::cross_entropy: {
            const int64_t v = output.size(-1);
            Tensor g2 = r.grad.reshape({leading_numel(output.shape()), v});
            r.value = be.cross_entropy(output.reshape({leading_numel(output.shape()), v}), target,
                                       divisor.ignore_index, n, g2);
            break;
        }
    }
    // the loss is a scalar of the model's dtype: round it as PyTorch would store it
    r.value = Tensor::scalar(r.value, output.dtype()).item();
    return r;
}

}  // namespace ptool
