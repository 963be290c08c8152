#include "backend/cuda/cublas_loader.h"

#include <type_traits>

#include "backend/cuda/dl_library.h"

namespace ptool::cuda {
namespace {

bool fill(const DlSymbols& resolve, CublasApi& api) {
    return resolve("cublasCreate_v2", api.create) && resolve("cublasDestroy_v2", api.destroy) &&
           resolve("cublasSetStream_v2", api.set_stream) &&
           resolve("cublasGemmStridedBatchedEx", api.gemm_strided_batched_ex) &&
           resolve("cublasGetVersion_v2", api.get_version) &&
           resolve("cublasGetProperty", api.get_property) &&
           resolve("cublasGetStatusString", api.status_string);
}

// the overload the table's pointer names must exist with exactly that signature; decltype does not
// odr-use it, so no build type (Debug included) links against libcublas
static_assert(std::is_same_v<decltype(static_cast<decltype(CublasApi::gemm_strided_batched_ex)>(
                                 &cublasGemmStridedBatchedEx)),
                             decltype(CublasApi::gemm_strided_batched_ex)>);

LazyLibrary<CublasApi>& library() {
    static LazyLibrary<CublasApi> lib(fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR), "libcublas", fill);
    return lib;
}

}  // namespace

const CublasApi* cublas() {
    return library().get();
}

const std::string& cublas_load_error() {
    return library().error();
}

std::string cublas_status_string(cublasStatus_t status) {
    const CublasApi* api = cublas();
    if (!api) return fmt::format("cublasStatus_t {}", static_cast<int>(status));
    return api->status_string(status);
}

}  // namespace ptool::cuda
