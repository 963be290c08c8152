// Redistribution between placements on one mesh dim (DESIGN §5), forward and backward.
//
//   from -> to               forward                  gradient (the grad of a Partial tensor is Replicate)
//   Shard(d) -> Replicate    all_gather(d)            grad Replicate -> chunk; grad Partial -> reduce_scatter(d)
//   Partial -> Replicate     all_reduce               identity
//   Partial -> Shard(d)      reduce_scatter(d)        all_gather(d)
//   Replicate -> Shard(d)    local chunk              all_gather(d)  (reduce_scatter(d) if the grad is Partial)
//   Shard(d) -> Shard(e)     all_gather(d) + chunk(e) all_gather(e) + chunk(d)
//   Replicate -> Partial     rank 0 keeps the value, others zero (no communication)
// Collectives work on dim 0; sharding on another dim moves it to the front and back (copies).
#pragma once

#include "comm/communicator.h"
#include "parallel/placement.h"

namespace ptool {

// local: this rank's piece of a tensor of shape `global` placed as `from`; returns its piece as `to`.
Tensor redistribute(const Tensor& local, const Placement& from, const Placement& to, const Shape& global,
                    Communicator& comm);

// The gradient of the input of redistribute(from -> to): grad_local is placed as grad_placement
// (usually `to`, or Partial); the result is placed as `from` (Replicate when from is Partial).
Tensor redistribute_backward(const Tensor& grad_local, const Placement& grad_placement, const Placement& from,
                             const Shape& global, Communicator& comm);

// The full tensor from this rank's piece (all_gather for Shard, all_reduce for Partial).
Tensor full_tensor(const Tensor& local, const Placement& p, const Shape& global, Communicator& comm);

}  // namespace ptool
