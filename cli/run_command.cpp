// ptool run MODEL: single-device training steps; prints loss and time per step.
#include <cmath>

#include "cli/commands.h"
#include "comm/comm_threads.h"
#include "core/file_roles.h"
#include "core/safetensors.h"
#include "core/yaml_reader.h"
#include "model/checkpoint.h"
#include "train/simulate.h"
#include "verify/golden.h"
#include "verify/loss_causes.h"

namespace ptool::cli {
namespace {

struct RunArgs {
    std::string model, init, data, dump;
    int64_t steps = 0;
};

void run(const RunArgs& a, const Common& c) {
    FileRoles()
        .input("MODEL", a.model)
        .input("--init", a.init)
        .input("--data", a.data)
        .output("--dump", a.dump)
        .check();
    if (!a.dump.empty()) check_output(a.dump, true);
    RunInputs in;
    in.model_path = a.model;
    in.model_text = read_file(a.model, YamlLimits{}.max_bytes);
    in.dtype_override = c.dtype;
    const Model model =
        load_model_text(in.model_text, a.model, c.dtype, false);  // exit 2 before anything runs
    in.device = select_device(c);
    TensorFile init, data;
    if (!a.init.empty()) init = read_checkpoint(a.init), in.init = &init, in.init_path = a.init;
    if (!a.data.empty()) data = read_safetensors(a.data), in.data = &data, in.data_path = a.data;
    const int64_t steps = a.steps > 0 ? a.steps : model.steps;
    if (in.data) check_data_steps(*in.data, a.data, steps);
    int64_t n_params = 0;
    for (const auto& [name, p] : model.named_parameters()) n_params += p->value.numel();
    if (c.verbosity >= 0)
        fmt::print("ptool run {}: {} parameters, {}, {}, {} step{}\n", a.model, n_params,
                   dtype_name(model.dtype), backend_for(in.device).name(), steps, steps == 1 ? "" : "s");
    RecordOptions ro;
    ro.events = false;
    ro.init_tensors = !a.dump.empty();
    ro.tensors = !a.dump.empty();  // the loss and time are all it prints
    double total = 0;
    ro.on_step = [&](int64_t k, double loss, double seconds) {
        total += seconds;
        if (c.verbosity >= 0)  // a NaN as PyTorch prints it ("nan"; a sign bit printed "-nan")
            fmt::print("step {:>3}  loss {:.8g}  {:.3f} ms\n", k, std::isnan(loss) ? std::fabs(loss) : loss,
                       seconds * 1e3);
    };
    require_host_memory(in, single_device_plan(), steps);           // exit 3 rather than the OOM killer
    require_valid_targets(model, single_device_plan(), in, steps);  // no loss nan over no target
    const RunRecord rec = record_reference(in, single_device_plan(), steps, ro);
    if (c.verbosity >= 0) fmt::print("total {:.3f} ms\n", total * 1e3);
    if (a.dump.empty()) return;
    TensorFile file = golden_tensors(rec, in, steps);
    file.metadata["ptool_version"] = PTOOL_VERSION;
    file.metadata["model_yaml"] = in.model_text;
    file.metadata["dtype"] = dtype_name(model.dtype);
    file.metadata["device"] = device_name(in.device);
    file.metadata["backend"] = backend_for(in.device).name();  // GPU name, SMs, cuBLAS version on cuda
    write_safetensors(a.dump, file);
    if (c.verbosity >= 0) fmt::print("wrote {}\n", a.dump);
}

}  // namespace

void add_run_command(CLI::App& app, Common& common) {
    auto args = std::make_shared<RunArgs>();
    CLI::App* cmd =
        app.add_subcommand("run", "Run single-device training steps of MODEL and print the loss per step");
    cmd->add_option("MODEL", args->model, "model YAML file")->required();
    cmd->add_option("--init", args->init,
                    "initial parameters and buffers (safetensors, PyTorch state_dict names)");
    cmd->add_option("--data", args->data,
                    "batch data (safetensors: input, target, step{k}.input, step{k}.target)");
    cmd->add_option("--steps", args->steps, "training steps (default: the model's `steps`)")
        ->transform(whole_number(1, kMaxSteps));
    cmd->add_option("--dtype", common.dtype,
                    "override the model's dtype: float32, bfloat16, float16, float64");
    add_device_options(cmd, common);
    cmd->add_option(
           "--dump", args->dump,
           "write every step's tensors in golden format (init.param.*, step{k}.loss/output/grad.*/param.*)")
        ->check(output_path());
    cmd->callback([args, &common] { run(*args, common); });
}

}  // namespace ptool::cli
