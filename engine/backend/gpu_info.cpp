// The one place that knows whether this build has CUDA.
#include "backend/gpu_info.h"

namespace ptool {

#ifdef PTOOL_HAVE_CUDA
GpuInfo query_gpus_cuda();
GpuInfo query_gpus() {
    return query_gpus_cuda();
}
int query_cublas_version_cuda();
int query_cublas_version() {
    return query_cublas_version_cuda();
}
size_t gpu_used_bytes_cuda();
size_t gpu_used_bytes() {
    return gpu_used_bytes_cuda();
}
#else
GpuInfo query_gpus() {
    GpuInfo info;
    info.why_none = "ptool was built without CUDA (no CUDA toolkit found at configure time)";
    return info;
}
int query_cublas_version() {
    return 0;
}
size_t gpu_used_bytes() {
    return 0;
}
#endif

}  // namespace ptool
