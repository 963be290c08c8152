// How core reaches memory that is not host memory. core sits below every backend, so the CUDA
// backend registers its allocator and copy routines here (backend/cuda/cuda_memory.cu) when the
// process first asks for a cuda device; a build without CUDA has none, and a cuda tensor is
// then a RuntimeError that says so.
//
// Every copy is synchronous with respect to the host (the data is in place when it returns),
// which is what Tensor's shallow host-side helpers (narrow, cat, clone, item) need. Kernels and
// collectives run on their own streams and order themselves.
#pragma once

#include <cstddef>

namespace ptool {

// meta: tensors with a shape, a dtype and no bytes (as PyTorch's meta device). Copies to or from
// meta move nothing; backend_for(meta) runs no kernel. A step executed on meta tensors costs what
// its bookkeeping costs: how train/simulate.h predicts memory and work without allocating any.
enum class Device { cpu, cuda, meta };
const char* device_name(Device d);

class DeviceMemory {
public:
    virtual ~DeviceMemory() = default;
    virtual void* allocate(size_t bytes) = 0;
    virtual void release(void* p, size_t bytes) = 0;
    virtual void zero(void* p, size_t bytes) = 0;
    virtual void synchronize() = 0;  // waits for the calling thread's queued device work
    // height rows of width bytes, from src (rows spitch apart) to dst (rows dpitch apart); either
    // side may be host or device.
    virtual void copy_2d(void* dst, size_t dpitch, Device dst_device, const void* src, size_t spitch,
                         Device src_device, size_t width, size_t height) = 0;
    // The one exception: device-to-device bytes queued on the calling thread's stream, in order
    // with its kernels; in place after synchronize(). For collectives that copy several pieces and
    // wait once (cuda_local's all_gather).
    virtual void copy_device_async(void* dst, const void* src, size_t bytes) = 0;
};

void register_device_memory(DeviceMemory* memory);  // the CUDA backend calls this once
DeviceMemory& device_memory();                      // throws RuntimeError when none is registered

// Rows of bytes between any two devices (host memcpy when both are the host).
void copy_rows(void* dst, size_t dpitch, Device dst_device, const void* src, size_t spitch, Device src_device,
               size_t width, size_t height);
inline void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
    copy_rows(dst, bytes, dst_device, src, bytes, src_device, bytes, 1);
}

}  // namespace ptool
