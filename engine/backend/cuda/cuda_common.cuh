// Shared pieces of the .cu files: element loads/stores in the accumulate type, the host-side
// dtype dispatch to device storage types, block reductions with a fixed order, the stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/launch_config.h"
#include "core/check.h"

namespace ptool::cuda {

// Device storage type for a host storage type.
template <class T>
struct device_type {
    using type = T;
};
template <>
struct device_type<bf16_t> {
    using type = __nv_bfloat16;
};
template <>
struct device_type<f16_t> {
    using type = __half;
};
template <class T>
using dev_t = typename device_type<T>::type;

template <class D>
using dacc_t = std::conditional_t<std::is_same_v<D, double>, double, float>;

__device__ __forceinline__ float to_acc(float v) {
    return v;
}
__device__ __forceinline__ double to_acc(double v) {
    return v;
}
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
__device__ __forceinline__ float to_acc(__half v) {
    return __half2float(v);
}

template <class D>
__device__ __forceinline__ D from_acc(dacc_t<D> v) {
    if constexpr (std::is_same_v<D, __nv_bfloat16>)
        return __float2bfloat16_rn(v);
    else if constexpr (std::is_same_v<D, __half>)
        return __float2half_rn(v);
    else
        return static_cast<D>(v);
}

inline cudaStream_t stream() {
    return static_cast<cudaStream_t>(cuda_current_stream());
}
int sm_count();

// Calls f(D{}) with D the device storage type of a floating dtype.
template <class F>
void dispatch(DType dt, F&& f) {
    dispatch_float(dt, [&](auto tag) { f(dev_t<decltype(tag)>{}); });
}

template <class T>
T* ptr(const Tensor& t) {
    return static_cast<T*>(t.raw());
}

// Sum over the block of one value per thread, in a fixed order (warp shuffles, then warp 0 over
// the warps' partials). Every thread gets the result. `scratch` holds blockDim.x / 32 values.
template <class A>
__device__ A block_sum(A v, A* scratch) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    A total = 0;
    for (int w = 0; w < warps; ++w) total += scratch[w];  // every thread, same order: same result
    return total;
}

template <class A>
__device__ A block_max(A v, A* scratch) {
    for (int o = 16; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    A m = scratch[0];
    for (int w = 1; w < warps; ++w) m = max(m, scratch[w]);
    return m;
}

#define PTOOL_GRID_STRIDE(i, n)                                               \
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
         i += int64_t{gridDim.x} * blockDim.x)

inline void check_launch() {
    PTOOL_CHECK_CUDA(cudaGetLastError());
}

}  // namespace ptool::cuda
