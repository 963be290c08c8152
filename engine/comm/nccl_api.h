// NCCL, loaded on first use (as cuBLAS: backend/cuda/cublas_loader.h): a linked NCCL adds its
// start-up to every ptool process, CPU runs included. The nccl communicator calls NCCL only
// through this table, and only to move bytes (ncclUint8): every reduction is ptool's own kernel
// in rank order (comm/comm_nccl.h).
#pragma once

#include <nccl.h>

#include <string>

namespace ptool {

struct NcclApi {
    decltype(&ncclGetVersion) get_version;
    decltype(&ncclGetUniqueId) get_unique_id;
    decltype(&ncclCommInitRankConfig) init_rank_config;
    decltype(&ncclCommSplit) split;
    decltype(&ncclCommGetAsyncError) get_async_error;
    decltype(&ncclCommAbort) abort;
    decltype(&ncclCommFinalize) finalize;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclBroadcast) broadcast;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclGetErrorString) error_string;
    decltype(&ncclGetLastError) last_error;
};

// The table, or nullptr when libnccl.so.2 cannot be loaded (nccl_load_error() says why).
const NcclApi* nccl_api();
const std::string& nccl_load_error();

// NCCL's words for a result and its last error (PTOOL_CHECK_NCCL, core/check.h).
std::string nccl_error_string(ncclResult_t result);

}  // namespace ptool
