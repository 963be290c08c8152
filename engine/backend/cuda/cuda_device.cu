// GPU discovery through the CUDA runtime: count, names, SM counts, driver/runtime versions.
// Built only when CMake finds a CUDA toolkit; engine/backend/gpu_info.cpp picks it.
#include <cuda_runtime.h>

#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/dl_library.h"
#include "backend/gpu_info.h"
#include "core/check.h"

namespace ptool {

GpuInfo query_gpus_cuda() {
    GpuInfo info;
    info.built_with_cuda = true;
    int runtime = 0;
    PTOOL_CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
    info.runtime_version = runtime;
    int driver = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver is installed
    info.driver_version = driver;
    // NCCL's version without linking it (comm/nccl_api.h loads NCCL the same way for the nccl communicator)
    std::string why;
    if (void* nccl = cuda::dl_open("libnccl.so.2", why)) {
        int (*get)(int*) = nullptr;
        if (cuda::dl_resolve(nccl, "libnccl", "ncclGetVersion", get, why)) get(&info.nccl_version);
    }
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {  // no driver or no device: not an error, there is just no GPU
        info.why_none = cudaGetErrorString(err);
        (void)cudaGetLastError();
        return info;
    }
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop{};
        PTOOL_CHECK_CUDA(cudaGetDeviceProperties(&prop, i));
        info.devices.push_back({prop.name, prop.multiProcessorCount, prop.major * 10 + prop.minor,
                                static_cast<size_t>(prop.totalGlobalMem)});
    }
    if (count == 0) info.why_none = "the CUDA runtime sees no device";
    return info;
}

size_t gpu_used_bytes_cuda() {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return total - free;
}

int query_cublas_version_cuda() {
    int major = 0, minor = 0, patch = 0;
    const cuda::CublasApi* blas = cuda::cublas();
    if (!blas || blas->get_property(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
        blas->get_property(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
        blas->get_property(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
        return 0;
    return major * 10000 + minor * 100 + patch;
}

}  // namespace ptool
