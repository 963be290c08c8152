// loss_parallel: cross_entropy on vocabulary-sharded logits, as torch.distributed.tensor.parallel's
// loss_parallel and Megatron's vocab_parallel_cross_entropy. Each rank holds the logits of its
// torch.chunk of the classes (Shard(-1)); the row maxima are all_reduced (max), then the sums of
// exp(x - max) and the target's logit (held by one rank, zero elsewhere) are all_reduced (sum):
// loss = the sum over the rows whose target is not ignore_index of (max + log(sum) - target logit),
// divided as model/loss.h's LossDivisor says (their count, or the step's over every rank). The
// gradient is this rank's columns of softmax - onehot, divided alike: no logits are gathered.
#pragma once

#include "comm/communicator.h"
#include "model/loss.h"

namespace ptool {

// logits: this rank's [.., V/tp] of [.., V] (Shard(-1)); target: class ids [..] (every rank all of them).
// Returns the loss (rounded to the logits' dtype) and the gradient of this rank's logits.
LossResult vocab_parallel_cross_entropy(const Placed& logits, const Tensor& target,
                                        const LossDivisor& divisor, Communicator& tp);

// The collectives it runs per step for logits of `global` shape: three all_reduces of one value per row.
std::vector<std::pair<Collective, int64_t>> vocab_parallel_cross_entropy_cost(const Shape& global,
                                                                              DType dtype);

}  // namespace ptool
