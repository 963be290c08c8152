// What GPUs this process can use. Works in every build: without CUDA support it says so.
#pragma once

#include <string>
#include <vector>

namespace ptool {

struct GpuDevice {
    std::string name;
    int sm_count = 0;
    int compute_capability = 0;  // 90 for sm_90 (H100/H200)
    size_t memory_bytes = 0;
};

struct GpuInfo {
    bool built_with_cuda = false;
    int runtime_version = 0;  // 13000 for CUDA 13.0
    int driver_version = 0;
    int nccl_version = 0;  // 22800 for NCCL 2.28.0; 0 when the build has no NCCL
    std::vector<GpuDevice> devices;
    std::string why_none;  // when devices is empty
};

GpuInfo query_gpus();
// The process's GPU's used bytes: total minus free (its CUDA context and whatever it allocated); 0
// without CUDA or a GPU.
size_t gpu_used_bytes();
// cuBLAS's version (130100 for 13.1.0), read from the library, which this loads (0.7 s, once per
// process: call it only where cuBLAS is used anyway); 0 without CUDA or when it cannot be loaded.
int query_cublas_version();

}  // namespace ptool
