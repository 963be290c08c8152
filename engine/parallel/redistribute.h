// Redistribution between placements on one mesh dim, forward and backward. One function,
// redistribution_steps, says what a redistribution does; redistribute runs those steps and
// redistribute_cost counts them, so explain's collectives are the ones verify runs.
//
//   from -> to               steps                      gradient (the grad of a Partial tensor is Replicate)
//   Shard(d) -> Replicate    all_gather(d)              grad Replicate -> chunk; grad Partial ->
//   reduce_scatter(d) Partial -> Replicate     all_reduce                 identity Partial -> Shard(d)
//   reduce_scatter(d)          all_gather(d) Replicate -> Shard(d)    chunk(d) (local) all_gather(d)
//   (reduce_scatter(d) if the grad is Partial) Shard(d) -> Shard(e)     all_gather(d), chunk(e)
//   all_gather(e), chunk(d) Replicate -> Partial     rank 0 keeps the value, the others zero (local)
// Collectives split dim 0; a shard of another dim travels packed (core/tensor_ops.h, pack_chunks).
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "core/placement.h"
#include "model/module.h"

namespace ptool {

enum class RedistOp { all_gather, all_reduce, reduce_scatter, chunk, zero_others };

struct RedistStep {
    RedistOp op;
    int64_t dim = 0;  // the shard dim of all_gather, reduce_scatter and chunk (normalised)
};

// What redistributing a tensor of `ndim` dims from one placement to another over `parts` ranks does.
std::vector<RedistStep> redistribution_steps(const Placement& from, const Placement& to, int64_t ndim,
                                             int parts);

// A collective of a step, as CommCounter counts it: all_gather the gathered output, all_reduce the
// tensor, reduce_scatter the input.
struct CommCost {
    Collective op;
    int64_t bytes = 0;
    std::string module;  // the module it belongs to ("" for the model's own, "(loss)")
    Phase phase = Phase::forward;
};
std::vector<CommCost> redistribute_cost(const Placement& from, const Placement& to, const Shape& global,
                                        int parts, size_t element_size);

// local: this rank's piece of a tensor of shape `global` placed as `from`; returns its piece as `to`.
Tensor redistribute(const Tensor& local, const Placement& from, const Placement& to, const Shape& global,
                    Communicator& comm);
Placed redistribute(const Placed& x, const Placement& to, Communicator& comm);

// The full tensor from this rank's piece (all_gather for Shard, all_reduce for Partial).
Tensor full_tensor(const Tensor& local, const Placement& p, const Shape& global, Communicator& comm);

}  // namespace ptool
