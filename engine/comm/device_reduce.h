// The cuda_local communicator's reduction: outs[k][i] = reduce over ranks 0..n-1, in that order,
// of inputs[r][i], in the accumulate type with one rounding: the same arithmetic as
// reduce_in_rank_order on the host, as a kernel on the calling thread's stream (every pointer is
// device memory). In a build without CUDA it throws RuntimeError.
#pragma once

#include <vector>

#include "comm/communicator.h"

namespace ptool {

constexpr int kMaxDeviceReduceRanks = 64;
void device_reduce_in_rank_order(const std::vector<const void*>& inputs, const std::vector<void*>& outs,
                                 int64_t count, DType dtype, ReduceOp op);

}  // namespace ptool
