// One check for the return codes of CUDA, cuBLAS, NCCL and MPI calls.
//
//   PTOOL_CHECK_CUDA(cudaMemcpyAsync(...));    cudaError_t, cudaSuccess
//   PTOOL_CHECK_CUBLAS(blas().create(&h));     cublasStatus_t, CUBLAS_STATUS_SUCCESS
//   PTOOL_CHECK_NCCL(nccl().send(...));        ncclResult_t, ncclSuccess (or ncclInProgress: non-blocking)
//   PTOOL_CHECK_MPI(MPI_Comm_dup(...));        int, MPI_SUCCESS
//
// A failed call throws RuntimeError (exit 3) with the statement, where it is and the library's
// own words: "cudaMemcpyAsync(...) failed at engine/comm/comm_nccl.cpp:196: invalid argument".
// PTOOL_CHECK_NCCL_WITH(stmt, on_failure) hands the message to on_failure instead (the nccl
// communicator aborts itself and names the rank before it throws).
//
// The macros only name each library's symbols, so core depends on none of them: a file that
// uses one includes its library's header (cuda_runtime.h; backend/cuda/cublas_loader.h for
// cublas_status_string; comm/nccl_api.h for nccl_error_string; comm/comm_mpi.h for
// mpi_error_string). Every one expands to PTOOL_CHECK_STATUS, the one implementation.
#pragma once

#include <string>

#include "core/error.h"

namespace ptool {

// "STMT failed at FILE:LINE: ERROR" (FILE without the build's leading "../")
std::string check_failure_message(const char* stmt, const char* file, int line, const std::string& error);
[[noreturn]] void throw_check_failure(const std::string& message);  // RuntimeError (kind other)

}  // namespace ptool

// Evaluates stmt once into `status_`; unless `ok` (an expression of status_) holds, calls
// on_failure with the message built from `text` (the statement as written) and `error` (an
// expression of status_). on_failure must not return. Each public macro stringifies its own
// argument (a nested macro would see it expanded: MPI_BYTE as its cast).
#define PTOOL_CHECK_STATUS(stmt, text, ok, error, on_failure)                                     \
    do {                                                                                          \
        const auto status_ = (stmt);                                                              \
        if (!(ok)) on_failure(::ptool::check_failure_message(text, __FILE__, __LINE__, (error))); \
    } while (0)

#define PTOOL_CHECK_CUDA(stmt)                                                           \
    PTOOL_CHECK_STATUS(stmt, #stmt, status_ == cudaSuccess, cudaGetErrorString(status_), \
                       ::ptool::throw_check_failure)
#define PTOOL_CHECK_CUBLAS(stmt)                                      \
    PTOOL_CHECK_STATUS(stmt, #stmt, status_ == CUBLAS_STATUS_SUCCESS, \
                       ::ptool::cuda::cublas_status_string(status_), ::ptool::throw_check_failure)
#define PTOOL_CHECK_NCCL_WITH(stmt, on_failure)                                          \
    PTOOL_CHECK_STATUS(stmt, #stmt, status_ == ncclSuccess || status_ == ncclInProgress, \
                       ::ptool::nccl_error_string(status_), on_failure)
#define PTOOL_CHECK_NCCL(stmt)                                                           \
    PTOOL_CHECK_STATUS(stmt, #stmt, status_ == ncclSuccess || status_ == ncclInProgress, \
                       ::ptool::nccl_error_string(status_), ::ptool::throw_check_failure)
#define PTOOL_CHECK_MPI(stmt)                                                                   \
    PTOOL_CHECK_STATUS(stmt, #stmt, status_ == MPI_SUCCESS, ::ptool::mpi_error_string(status_), \
                       ::ptool::throw_check_failure)
