// The CUDA backend's process-wide state: the device, the caching allocator behind every cuda
// tensor (registered with core as its DeviceMemory), the per-thread streams, and creation of
// the backend itself.
#include <cstdlib>
#include <memory>
#include <mutex>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ptool {
namespace {

struct CudaDriver final : RawAllocator {
    void* malloc(size_t bytes) override {
        void* p = nullptr;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError();  // out of memory is reported by the caching allocator
            return nullptr;
        }
        return p;
    }
    void free(void* p, size_t) override { cudaFree(p); }
};

class CudaMemory final : public DeviceMemory {
public:
    CudaMemory() : allocator_(driver_) {}
    void* allocate(size_t bytes) override {
        return allocator_.allocate(bytes, reinterpret_cast<uintptr_t>(cuda_current_stream()));
    }
    void release(void* p, size_t) override {
        // the block is reused on the stream that freed it, after work already queued there
        allocator_.release(p);
    }
    void zero(void* p, size_t bytes) override {
        PTOOL_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, cuda::stream()));
    }
    void copy_2d(void* dst, size_t dpitch, Device dst_device, const void* src, size_t spitch,
                 Device src_device, size_t width, size_t height) override {
        const cudaMemcpyKind kind =
            src_device == Device::cpu
                ? (dst_device == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                : (dst_device == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
        PTOOL_CHECK_CUDA(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, cuda::stream()));
        PTOOL_CHECK_CUDA(cudaStreamSynchronize(cuda::stream()));
    }
    void copy_device_async(void* dst, const void* src, size_t bytes) override {
        PTOOL_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream()));
    }
    void synchronize() override { PTOOL_CHECK_CUDA(cudaStreamSynchronize(cuda::stream())); }
    AllocatorStats stats() const { return allocator_.stats(); }

private:
    CudaDriver driver_;
    CachingAllocator allocator_;
};

// Never destroyed: tensors may outlive main's locals and free into them during exit.
std::once_flag init_once;
CudaMemory* memory = nullptr;
Backend* backend = nullptr;
CudaOptions chosen;
int sms = 0;                          // of the process's device (a node's GPUs are one model)
thread_local int thread_device = -1;  // cuda_set_thread_device's pin, or -1: the process's device

void init(const CudaOptions& options) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        throw RuntimeError(
            fmt::format("--device cuda: no CUDA device is available ({})",
                        err != cudaSuccess ? cudaGetErrorString(err) : "the runtime sees no device"));
    }
    if (options.device < 0 || options.device >= count)
        throw RuntimeError(
            fmt::format("--device cuda: device {} does not exist ({} visible)", options.device, count));
    PTOOL_CHECK_CUDA(cudaSetDevice(options.device));
    PTOOL_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options.device));
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);  // deterministic cuBLAS reductions (before any handle)
    chosen = options;
    memory = new CudaMemory();
    register_device_memory(memory);
    backend = make_cuda_backend(options).release();
}

}  // namespace

namespace cuda {
int sm_count() {
    return sms;
}
}  // namespace cuda

Backend& cuda_backend(const CudaOptions& options) {
    std::call_once(init_once, [&] { init(options); });
    if (!backend) throw RuntimeError("the CUDA backend failed to start earlier in this process");
    // rank threads start on device 0 otherwise; nccl rank threads are pinned to their own GPU
    PTOOL_CHECK_CUDA(cudaSetDevice(thread_device >= 0 ? thread_device : chosen.device));
    return *backend;
}

void cuda_set_thread_device(int device) {
    int count = 0;
    PTOOL_CHECK_CUDA(cudaGetDeviceCount(&count));
    PTOOL_REQUIRE(device >= 0 && device < count, "device {} does not exist ({} visible)", device, count);
    thread_device = device;
    PTOOL_CHECK_CUDA(cudaSetDevice(device));
}

AllocatorStats cuda_memory_stats() {
    return memory ? memory->stats() : AllocatorStats{};
}

void* cuda_current_stream() {
    thread_local struct Stream {
        cudaStream_t s = nullptr;
        ~Stream() {  // the thread ends: its queued work finishes before the stream goes
            if (s) cudaStreamSynchronize(s), cudaStreamDestroy(s);
        }
    } current;
    if (!current.s) PTOOL_CHECK_CUDA(cudaStreamCreateWithFlags(&current.s, cudaStreamNonBlocking));
    return current.s;
}

void cuda_synchronize_current_stream() {
    PTOOL_CHECK_CUDA(cudaStreamSynchronize(cuda::stream()));
}

}  // namespace ptool
