// cuBLAS, loaded on first use. Linking libcublas costs every ptool process 0.74 s of static
// initialisation at start (measured: an empty program linked with -lcublas takes 0.74 s, with
// -lcudart 0.01 s), which a CPU-only verify of a small plan (~30 ms) must not pay. So the
// backend dlopens libcublas.so.<major> the first time a GEMM or a version query needs it and
// calls it through this table.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace ptool::cuda {

struct CublasApi {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    // the int-sized C entry point (C++ also sees an int64_t overload of the same name)
    cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                              int, const void*, const void*, cudaDataType, int, long long int,
                                              const void*, cudaDataType, int, long long int, const void*,
                                              void*, cudaDataType, int, long long int, int,
                                              cublasComputeType_t, cublasGemmAlgo_t);
    decltype(&cublasGetVersion_v2) get_version;
    decltype(&cublasGetProperty) get_property;
    decltype(&cublasGetStatusString) status_string;
};

// The table, or nullptr when libcublas cannot be loaded (then why() says why).
const CublasApi* cublas();
const std::string& cublas_load_error();

// cuBLAS's words for a status (PTOOL_CHECK_CUBLAS, core/check.h).
std::string cublas_status_string(cublasStatus_t status);

}  // namespace ptool::cuda
