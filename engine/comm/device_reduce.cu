// The cuda_local reduction kernel: one thread per element walks the ranks in order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.cuh"
#include "comm/device_reduce.h"

namespace ptool {
namespace {
using namespace ptool::cuda;

struct Pointers {
    const void* in[kMaxDeviceReduceRanks];
    void* out[kMaxDeviceReduceRanks];
};

template <class D>
__global__ void reduce_kernel(Pointers p, int n_in, int n_out, int64_t count, ReduceOp op) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, count) {
        A acc = to_acc(static_cast<const D*>(p.in[0])[i]);
        for (int r = 1; r < n_in; ++r) {
            const A v = to_acc(static_cast<const D*>(p.in[r])[i]);
            acc = op == ReduceOp::max ? (acc < v ? v : acc)
                                      : acc + v;  // std::max's NaN behaviour, as on the host
        }
        if (op == ReduceOp::avg) acc /= A(n_in);
        const D result = from_acc<D>(acc);
        for (int k = 0; k < n_out; ++k) static_cast<D*>(p.out[k])[i] = result;
    }
}

}  // namespace

void device_reduce_in_rank_order(const std::vector<const void*>& inputs, const std::vector<void*>& outs,
                                 int64_t count, DType dtype, ReduceOp op) {
    PTOOL_REQUIRE(
        !inputs.empty() && inputs.size() <= kMaxDeviceReduceRanks && outs.size() <= kMaxDeviceReduceRanks,
        "cuda_local: {} ranks (at most {})", inputs.size(), kMaxDeviceReduceRanks);
    Pointers p{};
    for (size_t r = 0; r < inputs.size(); ++r) p.in[r] = inputs[r];
    for (size_t k = 0; k < outs.size(); ++k) p.out[k] = outs[k];
    const Launch l = elementwise_launch(count, sm_count());
    if (!l.grid) return;
    dispatch(dtype, [&](auto tag) {
        using D = decltype(tag);
        reduce_kernel<D><<<l.grid, l.block, 0, stream()>>>(p, static_cast<int>(inputs.size()),
                                                           static_cast<int>(outs.size()), count, op);
    });
    check_launch();
}

}  // namespace ptool
