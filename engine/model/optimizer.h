// torch.optim.SGD and torch.optim.AdamW over a list of parameters, with per-parameter state
// (momentum buffer; exp_avg and exp_avg_sq) kept in the parameter's dtype.
#pragma once

#include <map>

#include "backend/backend.h"
#include "model/model.h"

namespace ptool {

class Optimizer {
public:
    Optimizer(OptimizerSpec spec, Backend& backend) : spec_(std::move(spec)), backend_(backend) {}
    void step(const std::vector<std::pair<std::string, ParamPtr>>& params);

private:
    struct State {
        bool started = false;
        Tensor a, b;  // sgd: momentum_buffer (none without momentum); adamw: exp_avg, exp_avg_sq
    };
    OptimizerSpec spec_;
    Backend& backend_;
    std::map<const Parameter*, State> state_;
    int64_t step_ = 0;
};

}  // namespace ptool
