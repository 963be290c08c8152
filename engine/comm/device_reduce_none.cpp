// device_reduce_in_rank_order in a build without CUDA: there is no device memory to reduce.
#include "comm/device_reduce.h"

namespace ptool {

void device_reduce_in_rank_order(const std::vector<const void*>&, const std::vector<void*>&, int64_t, DType,
                                 ReduceOp) {
    throw RuntimeError("cuda_local: this ptool was built without CUDA");
}

}  // namespace ptool
