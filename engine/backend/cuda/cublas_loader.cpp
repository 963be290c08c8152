#include "backend/cuda/cublas_loader.h"

#include <mutex>
#include <type_traits>

#include "backend/cuda/dl_library.h"

namespace ptool::cuda {
namespace {

std::once_flag once;
CublasApi api;
bool loaded = false;
std::string error;

template <class F>
bool resolve(void* lib, const char* name, F& out) {
    return dl_resolve(lib, "libcublas", name, out, error);
}

void load() {
    void* lib = dl_open(fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR), error);
    if (!lib) return;
    loaded = resolve(lib, "cublasCreate_v2", api.create) && resolve(lib, "cublasDestroy_v2", api.destroy) &&
             resolve(lib, "cublasSetStream_v2", api.set_stream) &&
             resolve(lib, "cublasGemmStridedBatchedEx", api.gemm_strided_batched_ex) &&
             resolve(lib, "cublasGetVersion_v2", api.get_version) &&
             resolve(lib, "cublasGetProperty", api.get_property) &&
             resolve(lib, "cublasGetStatusString", api.status_string);
}

// the overload the table's pointer names must exist with exactly that signature; decltype does not
// odr-use it, so no build type (Debug included) links against libcublas
static_assert(std::is_same_v<decltype(static_cast<decltype(CublasApi::gemm_strided_batched_ex)>(
                                 &cublasGemmStridedBatchedEx)),
                             decltype(CublasApi::gemm_strided_batched_ex)>);

}  // namespace

const CublasApi* cublas() {
    std::call_once(once, load);
    return loaded ? &api : nullptr;
}

const std::string& cublas_load_error() {
    cublas();
    return error;
}

}  // namespace ptool::cuda
