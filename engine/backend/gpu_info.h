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
    int cublas_version = 0;   // 130000 for cuBLAS 13.0.0 (from the library, no GPU needed)
    int nccl_version = 0;     // 22800 for NCCL 2.28.0; 0 when the build has no NCCL
    std::vector<GpuDevice> devices;
    std::string why_none;  // when devices is empty
};

GpuInfo query_gpus();

}  // namespace ptool
