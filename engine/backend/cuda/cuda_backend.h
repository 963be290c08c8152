// The CUDA backend: cuBLAS for GEMM, .cu kernels for everything else, on the calling thread's
// stream (one stream per rank thread, so virtual ranks on one GPU do not serialise each other
// and each rank's work is ordered).
//
// Determinism (docs/architecture.md, GPUs): no atomics in any reduction (every sum has one fixed order: a
// thread walks its stride in order, then a fixed tree), CUBLAS_WORKSPACE_CONFIG=:4096:8 is set
// before cuBLAS starts, and TF32 is off unless --tf32 asks for it. So a run is bitwise
// reproducible run to run on the same GPU. 16-bit GEMMs use cublasGemmEx with fp32 compute.
//
// Host-side checks (shapes, dtypes, id ranges) are the CPU backend's, so both reject the same
// inputs with the same messages.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/caching_allocator.h"

namespace ptool {

struct CudaOptions {
    bool tf32 = false;  // allow TF32 tensor-core math in fp32 GEMMs (--tf32)
    int device = 0;     // CUDA device ordinal this process uses
};

// The process's CUDA backend, created on first use (throws RuntimeError when there is no GPU or
// the build has no CUDA). Options apply from the first call; later calls must pass the same.
Backend& cuda_backend(const CudaOptions& options = {});
AllocatorStats cuda_memory_stats();  // the caching allocator's counters (zeros before first use)

// Pins the calling thread to one GPU before its first CUDA work (the nccl communicator's rank
// threads, one per GPU): its stream, allocations and kernels live there. Threads that never call
// it use the process's device (CudaOptions::device).
void cuda_set_thread_device(int device);

// The current thread's stream (created on first use; one per rank thread) and a wait for it.
void* cuda_current_stream();
void cuda_synchronize_current_stream();

}  // namespace ptool
