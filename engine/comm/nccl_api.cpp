#include "comm/nccl_api.h"

#include "backend/cuda/dl_library.h"

namespace ptool {
namespace {

bool fill(const cuda::DlSymbols& resolve, NcclApi& api) {
    return resolve("ncclGetVersion", api.get_version) && resolve("ncclGetUniqueId", api.get_unique_id) &&
           resolve("ncclCommInitRankConfig", api.init_rank_config) && resolve("ncclCommSplit", api.split) &&
           resolve("ncclCommGetAsyncError", api.get_async_error) && resolve("ncclCommAbort", api.abort) &&
           resolve("ncclCommFinalize", api.finalize) && resolve("ncclCommDestroy", api.destroy) &&
           resolve("ncclAllGather", api.all_gather) && resolve("ncclBroadcast", api.broadcast) &&
           resolve("ncclSend", api.send) && resolve("ncclRecv", api.recv) &&
           resolve("ncclGroupStart", api.group_start) && resolve("ncclGroupEnd", api.group_end) &&
           resolve("ncclGetErrorString", api.error_string) && resolve("ncclGetLastError", api.last_error);
}

cuda::LazyLibrary<NcclApi>& library() {
    static cuda::LazyLibrary<NcclApi> lib(fmt::format("libnccl.so.{}", NCCL_MAJOR), "libnccl", fill);
    return lib;
}

}  // namespace

const NcclApi* nccl_api() {
    return library().get();
}

const std::string& nccl_load_error() {
    return library().error();
}

std::string nccl_error_string(ncclResult_t result) {
    const NcclApi* api = nccl_api();
    if (!api) return fmt::format("ncclResult_t {}", static_cast<int>(result));
    const char* last =
        api->last_error(nullptr);  // NCCL keeps the last error per thread; the comm argument is unused
    return last && *last ? fmt::format("{} ({})", api->error_string(result), last)
                         : api->error_string(result);
}

}  // namespace ptool
