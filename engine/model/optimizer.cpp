#include "model/optimizer.h"

#include <optional>

#include "backend/meta/meta_backend.h"
#include "core/framework_memory.h"

namespace ptool {

const char* optimizer_name(OptimizerType t) {
    return t == OptimizerType::adamw ? "adamw" : "sgd";
}

void Optimizer::step(const std::vector<std::pair<std::string, ParamPtr>>& params) {
    std::vector<Piece> pieces;
    pieces.reserve(params.size());
    for (const auto& [name, p] : params) pieces.push_back({p.get(), p->value, p->grad});
    step(pieces);
}

void Optimizer::step(const std::vector<Piece>& pieces) {
    ++step_;
    std::vector<bool> first(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {  // torch.optim creates every state before it updates
        State& s = state_[pieces[i].key];
        first[i] = !s.started;
        if (!first[i]) continue;  // plain SGD keeps no state, as torch.optim.SGD with momentum 0
        s.started = true;
        const Piece& p = pieces[i];
        MemoryUseScope use(MemoryUse::optimizer);
        if (spec_.type == OptimizerType::adamw || spec_.momentum != 0.0)
            s.a = Tensor(p.value.shape(), p.value.dtype(), p.value.device());  // zeros
        if (spec_.type == OptimizerType::adamw)
            s.b = Tensor(p.value.shape(), p.value.dtype(), p.value.device());
    }
    // AdamW's foreach update (torch's default on CUDA): _foreach_sqrt(exp_avg_sqs) is a new tensor per
    // parameter, all alive until the update ends; its kernels are counted as their sequence
    const bool foreach = spec_.type == OptimizerType::adamw && !spec_.fused;
    std::vector<Tensor> denominators;
    std::optional<MetaKernelScope> in_kernels;
    if (spec_.type == OptimizerType::adamw) {
        for (const Piece& p : pieces) {
            if (foreach)
                denominators.push_back(
                    torch_only(p.value.shape(), p.value.dtype(), MemoryUse::optimizer_temporaries));
            meta_count_op(foreach ? OpClass::adamw_foreach : OpClass::adamw_fused, p.value.dtype(),
                          static_cast<double>(p.value.numel()), 0);
        }
        if (!pieces.empty())  // one launch per op per group of tensors (multi_tensor_apply)
            meta_count_op(foreach ? OpClass::adamw_foreach : OpClass::adamw_fused, pieces[0].value.dtype(), 0,
                          framework_kernels(foreach ? OpClass::adamw_foreach : OpClass::adamw_fused,
                                            pieces[0].value.dtype()));
        in_kernels.emplace(MetaKernelMode{.on_chip = true});
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
        Piece p = pieces[i];  // handles: the views write into the parameters
        State& s = state_[p.key];
        if (spec_.type == OptimizerType::sgd) {
            backend_.sgd_step(p.value, p.grad, s.a, spec_.lr, spec_.momentum, spec_.weight_decay, first[i]);
        } else {
            backend_.adamw_step(p.value, p.grad, s.a, s.b, step_, spec_.lr, spec_.beta1, spec_.beta2,
                                spec_.eps, spec_.weight_decay);
        }
    }
}

}  // namespace ptool
