#include "core/device_memory.h"

#include <atomic>
#include <cstring>

#include "core/error.h"

namespace ptool {
namespace {
std::atomic<DeviceMemory*> registered{nullptr};
}  // namespace

const char* device_name(Device d) {
    return d == Device::cpu ? "cpu" : d == Device::cuda ? "cuda" : "meta";
}

void register_device_memory(DeviceMemory* memory) {
    registered.store(memory);
}

DeviceMemory& device_memory() {
    DeviceMemory* m = registered.load();
    if (!m)
        throw RuntimeError(
            "a cuda tensor was used, but no CUDA device is available (this ptool was built without "
            "CUDA, or the CUDA backend was not selected with --device cuda)");
    return *m;
}

void copy_rows(void* dst, size_t dpitch, Device dst_device, const void* src, size_t spitch, Device src_device,
               size_t width, size_t height) {
    if (width == 0 || height == 0 || dst_device == Device::meta || src_device == Device::meta) return;
    if (dst_device == Device::cpu && src_device == Device::cpu) {
        if (dpitch == width && spitch == width) {
            std::memcpy(dst, src, width * height);
            return;
        }
        for (size_t r = 0; r < height; ++r)
            std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                        width);
        return;
    }
    device_memory().copy_2d(dst, dpitch, dst_device, src, spitch, src_device, width, height);
}

}  // namespace ptool
