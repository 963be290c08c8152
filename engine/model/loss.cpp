#include "model/loss.h"

namespace ptool {

LossResult compute_loss(Backend& be, LossKind kind, const Tensor& output, const Tensor& target) {
    LossResult r;
    r.grad = empty_like(output);
    switch (kind) {
        case LossKind::sum:
            r.value = be.sum_all(output);
            be.fill(r.grad, 1.0);
            break;
        case LossKind::mean:
            r.value = be.sum_all(output) / static_cast<double>(output.numel());
            be.fill(r.grad, 1.0 / static_cast<double>(output.numel()));
            break;
        case LossKind::mse:
            r.value = be.mse(output, target, r.grad);
            break;
        case LossKind::cross_entropy: {
            const int64_t v = output.size(-1);
            Tensor g2 = r.grad.reshape({leading_numel(output.shape()), v});
            r.value = be.cross_entropy(output.reshape({leading_numel(output.shape()), v}), target, g2);
            break;
        }
    }
    // the loss is a scalar of the model's dtype: round it as PyTorch would store it
    r.value = Tensor::scalar(r.value, output.dtype()).item();
    return r;
}

}  // namespace ptool
