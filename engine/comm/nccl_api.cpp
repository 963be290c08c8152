#include "comm/nccl_api.h"

#include <mutex>

#include "backend/cuda/dl_library.h"

namespace ptool {
namespace {

std::once_flag once;
NcclApi api;
bool loaded = false;
std::string error;

template <class F>
bool resolve(void* lib, const char* name, F& out) {
    return cuda::dl_resolve(lib, "libnccl", name, out, error);
}

void load() {
    void* lib = cuda::dl_open(fmt::format("libnccl.so.{}", NCCL_MAJOR), error);
    if (!lib) return;
    loaded = resolve(lib, "ncclGetVersion", api.get_version) && resolve(lib, "ncclGetUniqueId", api.get_unique_id) &&
             resolve(lib, "ncclCommInitRankConfig", api.init_rank_config) &&
             resolve(lib, "ncclCommSplit", api.split) && resolve(lib, "ncclCommGetAsyncError", api.get_async_error) &&
             resolve(lib, "ncclCommAbort", api.abort) && resolve(lib, "ncclCommFinalize", api.finalize) &&
             resolve(lib, "ncclCommDestroy", api.destroy) && resolve(lib, "ncclAllGather", api.all_gather) &&
             resolve(lib, "ncclBroadcast", api.broadcast) && resolve(lib, "ncclSend", api.send) &&
             resolve(lib, "ncclRecv", api.recv) && resolve(lib, "ncclGroupStart", api.group_start) &&
             resolve(lib, "ncclGroupEnd", api.group_end) && resolve(lib, "ncclGetErrorString", api.error_string) &&
             resolve(lib, "ncclGetLastError", api.last_error);
}

}  // namespace

const NcclApi* nccl_api() {
    std::call_once(once, load);
    return loaded ? &api : nullptr;
}

const std::string& nccl_load_error() {
    nccl_api();
    return error;
}

}  // namespace ptool
