// --device and --tf32, shared by run and verify.
#include "backend/backend.h"
#include "cli/commands.h"
#include "core/error.h"

namespace ptool::cli {

void add_device_options(CLI::App* cmd, Common& common) {
    cmd->add_option("--device", common.device, "cpu or cuda (cuda: every rank on one GPU, cuda_local collectives)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_flag("--tf32", common.tf32, "allow TF32 tensor-core math in fp32 GEMMs on cuda (off by default)");
}

Device select_device(const Common& common) {
    if (common.device != "cpu" && common.device != "cuda")
        throw InputError(fmt::format("unknown device '{}' (valid: cpu, cuda)", common.device));
    if (common.tf32 && common.device != "cuda") throw InputError("--tf32 applies to --device cuda");
    configure_backends({common.tf32, 0});
    const Device device = common.device == "cuda" ? Device::cuda : Device::cpu;
    if (device == Device::cuda) backend_for(device);  // no GPU: exit 3 now, with the reason, before any rank starts
    return device;
}

}  // namespace ptool::cli
