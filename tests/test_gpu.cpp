// GPU discovery. Runs everywhere; the device checks need a GPU and skip (exit 4) without one.
#include <cstdio>
#include <cstdlib>

#include "backend/gpu_info.h"

using namespace ptool;

int main() {
    GpuInfo info = query_gpus();
#ifdef PTOOL_TEST_EXPECT_CUDA
    if (!info.built_with_cuda || info.runtime_version < 12000) {
        std::printf("FAIL: built with the CUDA toolkit but the runtime reports version %d\n",
                    info.runtime_version);
        return 1;
    }
    const int cublas = query_cublas_version();  // dlopens cuBLAS: no GPU needed
    if (cublas < 120000) {
        std::printf("FAIL: cuBLAS reports version %d\n", cublas);
        return 1;
    }
    std::printf("CUDA runtime %d, cuBLAS %d, NCCL %d\n", info.runtime_version, cublas, info.nccl_version);
#endif
    if (info.devices.empty()) {
        std::printf("SKIP: no GPU: %s\n", info.why_none.c_str());
        return 4;
    }
    for (const auto& d : info.devices) {
        std::printf("%s: %d SMs, sm_%d, %.1f GiB\n", d.name.c_str(), d.sm_count, d.compute_capability,
                    d.memory_bytes / 1073741824.0);
        if (d.sm_count <= 0 || d.memory_bytes == 0) return 1;
    }
    std::printf("1 passed, 0 failed\n");
    return 0;
}
