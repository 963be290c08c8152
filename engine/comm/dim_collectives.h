// all_gather and reduce_scatter along any dim of a tensor, with torch.chunk pieces. Dim 0 is the
// collectives' own; another dim's shards travel as rows of [size(d), rest] (core/tensor_ops.h,
// pack_chunks) and are unpacked once. Used by redistribution (parallel/redistribute.h) and by
// context parallel attention's keys and values (model/modules/attention.cpp).
#pragma once

#include "comm/communicator.h"

namespace ptool {

// The whole tensor of shape `global` from every rank's chunk along dim d.
Tensor all_gather_dim(const Tensor& local, int64_t d, const Shape& global, Communicator& comm);
// This rank's chunk along dim d of the sum over ranks of each one's whole tensor.
Tensor reduce_scatter_dim(const Tensor& full_partial, int64_t d, Communicator& comm);

}  // namespace ptool
