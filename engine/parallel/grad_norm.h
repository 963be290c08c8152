// clip_grad_norm: torch.nn.utils.clip_grad_norm_(parameters, max_norm) on a parallel model. The norm
// is the L2 norm of the full gradients, not of a rank's pieces: each rank sums the squares of its
// pieces per parameter (in double); then, dim by dim in the order that cuts parameters (tp, then the
// data dims: ParallelDims::param_nesting), the squares of the pieces sharded on that dim are summed
// over its ranks (a replicated piece counts once); the total is the same on every rank, bitwise.
// Then clip_coef = max_norm / (norm + 1e-6), clamped to 1, scales every gradient, as PyTorch does.
// Under pipeline parallelism every stage's squares are all_gathered over the pp dim and summed in
// the parameters' order (the whole model's, when a rank holds several stages). The collectives (one per dim
// of more than one rank) run under the counter's site "clip_grad_norm".
#pragma once

#include <functional>

#include "comm/communicator.h"
#include "core/placement.h"
#include "model/module.h"

namespace ptool {

struct GradNormInputs {
    std::vector<std::pair<std::string, ParamPtr>> params;
    std::function<Placements(const Parameter*)> placements;
    struct Dim {
        int mesh_dim;
        Communicator* comm;
    };
    std::vector<Dim> dims;  // in param_nesting order
    // Pipeline parallel: the stages' group. Each stage holds its own parameters; their squares are
    // gathered in stage order (the parameters' order) and summed in that order, as one device sums them.
    Communicator* stages = nullptr;
    // Whether a parameter's squares count in the norm (default: every one): a weight tied across
    // stages counts on the first stage that holds it only (Megatron leaves its shared copies out of
    // the norm), though clipping scales every copy.
    std::function<bool(const Parameter*)> counted;
    // Where a parameter comes in the whole model's parameter order, when the ranks' stages are not
    // consecutive (interleaved_1f1b: rank r holds stages r, r + pp, ...): the gathered squares are
    // summed in that order, as one device sums them. Unset: in the order they are gathered.
    std::function<int64_t(const Parameter*)> order;
    // This rank's pieces of a parameter's gradient, whose squares it sums and which clipping scales
    // (ZeRO-2: its shards, the parameter then placed Shard on the dp dim). Unset: the gradient, whole.
    std::function<std::vector<Tensor>(const Parameter*)> grads;
    // The norm clipping divides by and the call returns, from the total norm computed (unset: that
    // norm; a RunLayer's clip_norm may change it).
    std::function<double(double)> norm_used;
};

// Returns the total norm before clipping.
double clip_grad_norm(const GradNormInputs& in, double max_norm, Backend& be);

// Its collectives per step: an all_reduce of one double per parameter on each dim of more than one
// rank (`dims`: the sizes of the dims that cut parameters).
std::vector<std::pair<Collective, int64_t>> clip_grad_norm_cost(int64_t params, const std::vector<int>& dims);

}  // namespace ptool
