#include "model/optimizer.h"

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
    for (Piece p : pieces) {  // handles: the views write into the parameters
        State& s = state_[p.key];
        const bool first = !s.started;
        if (first) {  // plain SGD keeps no state, as torch.optim.SGD with momentum 0
            s.started = true;
            MemoryUseScope use(MemoryUse::optimizer);
            if (spec_.type == OptimizerType::adamw || spec_.momentum != 0.0)
                s.a = Tensor(p.value.shape(), p.value.dtype(), p.value.device());  // zeros
            if (spec_.type == OptimizerType::adamw)
                s.b = Tensor(p.value.shape(), p.value.dtype(), p.value.device());
        }
        if (spec_.type == OptimizerType::sgd) {
            backend_.sgd_step(p.value, p.grad, s.a, spec_.lr, spec_.momentum, spec_.weight_decay, first);
        } else {
            backend_.adamw_step(p.value, p.grad, s.a, s.b, step_, spec_.lr, spec_.beta1, spec_.beta2,
                                spec_.eps, spec_.weight_decay);
        }
    }
}

}  // namespace ptool
