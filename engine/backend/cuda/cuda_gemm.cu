// GEMM on the GPU: cublasGemmStridedBatchedEx for every dtype. Row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T, so A and B swap places in the call. fp32 computes in
// fp32 (TF32 only with --tf32), 16-bit types in fp32 with one rounding on store, as on the CPU.
#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ptool {
namespace {

const cuda::CublasApi& blas() {
    const cuda::CublasApi* api = cuda::cublas();
    if (!api) throw RuntimeError(fmt::format("--device cuda: {}", cuda::cublas_load_error()));
    return *api;
}

cublasHandle_t handle() {  // one per thread: a handle is not to be shared between rank threads
    thread_local struct Handle {
        cublasHandle_t h = nullptr;
        ~Handle() {
            if (h) blas().destroy(h);
        }
    } current;
    if (!current.h) PTOOL_CHECK_CUBLAS(blas().create(&current.h));
    PTOOL_CHECK_CUBLAS(blas().set_stream(current.h, cuda::stream()));
    return current.h;
}

int as_int(int64_t v, const char* what) {
    PTOOL_REQUIRE(v >= 0 && v <= INT32_MAX, "gemm: {} = {} does not fit cuBLAS's int", what, v);
    return static_cast<int>(v);
}

}  // namespace

void CudaBackend::gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double alpha,
                       double beta) {
    require_same_dtype(a, b, "gemm");
    require_same_dtype(a, c, "gemm");
    const GemmDims d = gemm_dims(a, ta, b, tb, c);
    if (d.m == 0 || d.n == 0) return;
    if (d.k == 0) {  // an empty sum: c = beta * c (an uneven shard can hold no columns)
        if (beta == 0.0)
            fill(c, 0.0);
        else
            scale(c, beta, c);
        return;
    }
    cudaDataType_t type = CUDA_R_32F;
    cublasComputeType_t compute = options_.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    switch (a.dtype()) {
        case DType::float32:
            break;
        case DType::float64:
            type = CUDA_R_64F, compute = CUBLAS_COMPUTE_64F;
            break;
        case DType::bfloat16:
            type = CUDA_R_16BF, compute = CUBLAS_COMPUTE_32F;
            break;
        case DType::float16:
            type = CUDA_R_16F, compute = CUBLAS_COMPUTE_32F;
            break;
        default:
            PTOOL_REQUIRE(false, "gemm on {}", dtype_name(a.dtype()));
    }
    const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
    const void* alpha_p = type == CUDA_R_64F ? static_cast<const void*>(&alpha) : &alpha_f;
    const void* beta_p = type == CUDA_R_64F ? static_cast<const void*>(&beta) : &beta_f;
    const int m = as_int(d.m, "M"), n = as_int(d.n, "N"), k = as_int(d.k, "K");
    const int lda = ta ? m : k, ldb = tb ? k : n;
    PTOOL_CHECK_CUBLAS(blas().gemm_strided_batched_ex(
        handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, alpha_p, b.raw(),
        type, ldb, d.b_shared ? 0 : d.k * d.n, a.raw(), type, lda, d.m * d.k, beta_p, c.raw(), type, n,
        d.m * d.n, as_int(d.batch, "batch"), compute, CUBLAS_GEMM_DEFAULT));
}

std::string CudaBackend::name() const {
    cudaDeviceProp prop{};
    PTOOL_CHECK_CUDA(cudaGetDeviceProperties(&prop, options_.device));
    int cublas = 0;
    blas().get_version(handle(), &cublas);
    return fmt::format("cuda ({}, {} SMs, cuBLAS {}{})", prop.name, prop.multiProcessorCount, cublas,
                       options_.tf32 ? ", TF32 allowed" : "");
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) {
    return std::make_unique<CudaBackend>(options);
}

}  // namespace ptool
