// The one place that picks a backend for a device, and knows whether this build has CUDA.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/meta/meta_backend.h"
#ifdef PTOOL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace ptool {
namespace {
BackendOptions configured;
}  // namespace

void configure_backends(const BackendOptions& options) {
    configured = options;
}

Backend& backend_for(Device device) {
    static CpuBackend cpu;
    if (device == Device::cpu) return cpu;
    if (device == Device::meta) return meta_backend();
#ifdef PTOOL_HAVE_CUDA
    return cuda_backend(CudaOptions{configured.tf32, configured.cuda_device});
#else
    throw InputError("ptool was built without CUDA support: --device cuda is not available");
#endif
}

void Backend::attention_forward(const AttentionArgs&, const Tensor& q, const Tensor&, const Tensor&, Tensor&,
                                Tensor&, Tensor&) {
    PTOOL_REQUIRE(false, "backend '{}' has no fused attention for {} (ask fused_attention first)", name(),
                  dtype_name(q.dtype()));
}

void Backend::attention_backward(const AttentionArgs&, const Tensor& q, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                                 Tensor&, bool) {
    PTOOL_REQUIRE(false, "backend '{}' has no fused attention for {} (ask fused_attention first)", name(),
                  dtype_name(q.dtype()));
}

Tensor to_dtype(Backend& be, const Tensor& t, DType dt) {
    if (t.dtype() == dt) return t;
    Tensor out = Tensor::empty(t.shape(), dt, t.device());
    be.copy(t, out);
    return out;
}

}  // namespace ptool
