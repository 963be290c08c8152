// torch.optim.SGD and torch.optim.AdamW over a list of parameters, with per-parameter state
// (momentum buffer; exp_avg and exp_avg_sq) kept in the parameter's dtype. Both update elementwise,
// so a piece of a parameter (ZeRO's shard of the flat parameter space, parallel/zero_optimizer.h)
// steps as the whole would, with state of the piece's size only.
#pragma once

#include <map>

#include "backend/backend.h"
#include "model/model.h"

namespace ptool {

class Optimizer {
public:
    Optimizer(OptimizerSpec spec, Backend& backend) : spec_(std::move(spec)), backend_(backend) {}
    void step(const std::vector<std::pair<std::string, ParamPtr>>& params);
    // A contiguous piece of a parameter's value and its gradient (views, same shape), its state keyed
    // by `key` (one per piece for the run's life).
    struct Piece {
        const void* key;
        Tensor value, grad;
    };
    void step(const std::vector<Piece>& pieces);

private:
    struct State {
        bool started = false;
        Tensor a, b;  // sgd: momentum_buffer (none without momentum); adamw: exp_avg, exp_avg_sq
    };
    OptimizerSpec spec_;
    Backend& backend_;
    std::map<const void*, State> state_;
    int64_t step_ = 0;
};

}  // namespace ptool
