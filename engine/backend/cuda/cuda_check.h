// One check macro for CUDA runtime calls: names the statement, file:line and CUDA's message, and
// throws RuntimeError (exit 3). cuBLAS and NCCL checks will be built on the same helper.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define PTOOL_CHECK_GEN(stmt, ok, errstr)                                                              \
    do {                                                                                              \
        auto status_ = (stmt);                                                                        \
        if (status_ != (ok))                                                                          \
            throw ::ptool::RuntimeError(fmt::format("{} failed at {}:{}: {}", #stmt, __FILE__, __LINE__, \
                                                    errstr(status_)));                               \
    } while (0)

#define CUDA_CHECK(stmt) PTOOL_CHECK_GEN(stmt, cudaSuccess, cudaGetErrorString)
