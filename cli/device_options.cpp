// --device and --tf32, shared by run and verify.
#include <cmath>
#include <cstdlib>

#include "backend/backend.h"
#include "backend/gpu_info.h"
#include "cli/commands.h"
#include "comm/comm_choice.h"
#include "comm/comm_mpi.h"
#include "core/error.h"

namespace ptool::cli {

void add_device_options(CLI::App* cmd, Common& common) {
    cmd->add_option("--device", common.device,
                    "cpu or cuda (cuda: nccl, one rank per GPU, when there are GPUs enough; else every rank "
                    "on one GPU, cuda_local)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_flag("--tf32", common.tf32,
                  "allow TF32 tensor-core math in fp32 GEMMs on cuda (off by default)");
}

Device select_device(const Common& common) {
    if (common.device != "cpu" && common.device != "cuda")
        throw InputError(fmt::format("unknown device '{}' (valid: cpu, cuda)", common.device));
    if (common.tf32 && common.device != "cuda") throw InputError("--tf32 applies to --device cuda");
    const Device device = common.device == "cuda" ? Device::cuda : Device::cpu;
    int gpu = 0;  // in-process: the process's GPU is 0 (nccl rank threads pin GPU r themselves)
    if (device == Device::cuda && launched_by_mpi())  // one GPU per process: its node-local rank
        gpu = gpu_for_local_rank(launcher_local_rank(), static_cast<int>(query_gpus().devices.size()));
    configure_backends({common.tf32, gpu});
    if (device == Device::cuda)
        backend_for(device);  // no GPU: exit 3 now, with the reason, before any rank starts
    return device;
}

}  // namespace ptool::cli
