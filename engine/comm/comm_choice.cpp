#include "comm/comm_choice.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/gpu_info.h"
#include "comm/comm_nccl.h"
#include "comm/comm_threads.h"

namespace ptool {
namespace {

int env_int(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) return -1;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    return *end == '\0' && n >= 0 && n < (1 << 24) ? static_cast<int>(n) : -1;
}

}  // namespace

const char* comm_kind_name(CommKind kind) {
    switch (kind) {
        case CommKind::threads:
            return "threads";
        case CommKind::cuda_local:
            return "cuda_local";
        case CommKind::nccl:
            return "nccl";
    }
    return "?";
}

CommKind in_process_comm(Device device, int ranks, int visible_gpus) {
    if (device == Device::cpu) return CommKind::threads;
    return ranks > 1 && ranks <= visible_gpus ? CommKind::nccl : CommKind::cuda_local;
}

LocalRank launcher_local_rank() {
    const char* const pairs[][2] = {{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                                    {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
                                    {"MPI_LOCALRANKID", "MPI_LOCALNRANKS"}};
    for (const auto& p : pairs)
        if (const int r = env_int(p[0]); r >= 0) return {r, env_int(p[1])};
    return {};
}

int gpu_for_local_rank(LocalRank local, int visible_gpus) {
    if (visible_gpus <= 0) throw RuntimeError("--device cuda: no CUDA device is available on this node");
    if (local.rank < 0)
        throw InputError(
            "--device cuda under a launcher needs the node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, "
            "SLURM_LOCALID or MPI_LOCALRANKID) to pick this process's GPU");
    const int ranks = std::max(local.size, local.rank + 1);
    if (ranks > visible_gpus)
        throw InputError(
            fmt::format("--device cuda under mpirun runs one rank per GPU: this node runs {} ranks but "
                        "sees {} GPU{} (run in-process instead: cuda_local puts every rank on one GPU)",
                        ranks, visible_gpus, visible_gpus == 1 ? "" : "s"));
    return local.rank;
}

void run_ranks(int n, const CommOptions& options, const std::function<void(Communicator&)>& fn, Device device,
               std::shared_ptr<CoreSlots> cores) {
    const int gpus = device == Device::cpu ? 0 : static_cast<int>(query_gpus().devices.size());
    if (in_process_comm(device, n, gpus) == CommKind::nccl) return run_nccl_threads(n, options, fn);
    if (cores) return run_rank_threads(n, options, fn, device, std::move(cores));
    const GemmThreadShare share(device == Device::cpu ? n : 1,
                                device == Device::cpu ? n : 1);  // the rank threads share the cores
    run_rank_threads(n, options, fn, device);
}

}  // namespace ptool
