// clip_grad_norm: torch.nn.utils.clip_grad_norm_(parameters, max_norm) on a parallel model. The norm
// is the L2 norm of the full gradients, not of a rank's pieces: each rank sums the squares of its
// pieces per parameter (in double); the pieces sharded on the tp dim are summed over tp, then
// those sharded on the dp dim over dp (a replicated piece counts once); the total is the same on
// every rank, bitwise. Then clip_coef = max_norm / (norm + 1e-6), clamped to 1, scales every
// gradient, as PyTorch does. The two all_reduces run under the counter's site "clip_grad_norm".
#pragma once

#include <functional>

#include "comm/communicator.h"
#include "model/module.h"

namespace ptool {

struct GradNormInputs {
    std::vector<std::pair<std::string, ParamPtr>> params;
    std::function<bool(const Parameter*)> sharded_on_tp, sharded_on_dp;
};

// Returns the total norm before clipping.
double clip_grad_norm(const GradNormInputs& in, double max_norm, Communicator& tp, Communicator& dp, Backend& be);

// Its collectives per step: an all_reduce of one double per parameter on each dim of more than one rank.
std::vector<std::pair<const char*, int64_t>> clip_grad_norm_cost(int64_t params, int tp, int dp);

}  // namespace ptool
