#include "core/framework_memory.h"

namespace ptool {

Tensor torch_only(Shape shape, DType dtype, MemoryUse use, AllocStream stream) {
    MemoryUseScope as(use);
    TorchAllocScope torch(TorchAlloc::torch_only, stream);
    return Tensor::empty(std::move(shape), dtype, Device::meta);
}

void torch_release(const Tensor& t) {
    if (!t.defined()) return;
    if (const auto account = current_memory_account()) account->torch_release(t.storage_key());
}

}  // namespace ptool
