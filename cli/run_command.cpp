// ptool run MODEL: single-device training steps; prints loss and time per step.
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "core/safetensors.h"
#include "model/batch.h"
#include "verify/reference.h"

namespace ptool::cli {
namespace {

struct RunArgs {
    std::string model, init, data, dump;
    int64_t steps = 0;
};

void run(const RunArgs& a, const Common& c) {
    Model model = load_model(a.model, c.dtype);
    const Device device = select_device(c);
    if (!a.init.empty()) load_state_dict(model, read_safetensors(a.init), a.init);
    TensorFile data_file;
    if (!a.data.empty()) data_file = read_safetensors(a.data);
    DataSource data(model, a.data.empty() ? nullptr : &data_file, a.data);
    ReferenceOptions opt;
    opt.steps = a.steps > 0 ? a.steps : model.steps;
    opt.device = device;

    int64_t n_params = 0;
    for (const auto& [name, p] : model.named_parameters()) n_params += p->value.numel();
    if (c.verbosity >= 0)
        fmt::print("ptool run {}: {} parameters, {}, {}, {} step{}\n", a.model, n_params, dtype_name(model.dtype),
                   backend_for(device).name(), opt.steps, opt.steps == 1 ? "" : "s");
    GoldenWriter writer(model, data.varies_per_step());
    double total = 0;
    run_reference(model, data, opt, [&](const StepResult& r) {
        total += r.seconds;
        if (c.verbosity >= 0) fmt::print("step {:>3}  loss {:.8g}  {:.3f} ms\n", r.step, r.loss, r.seconds * 1e3);
        if (!a.dump.empty()) writer.add_step(r);
    });
    if (c.verbosity >= 0) fmt::print("total {:.3f} ms\n", total * 1e3);
    if (!a.dump.empty()) {
        writer.file().metadata["ptool_version"] = PTOOL_VERSION;
        writer.file().metadata["model_yaml"] = model.yaml_text;
        writer.file().metadata["dtype"] = dtype_name(model.dtype);
        writer.file().metadata["device"] = device_name(device);
        writer.file().metadata["backend"] = backend_for(device).name();  // GPU name, SMs, cuBLAS version on cuda
        write_safetensors(a.dump, writer.file());
        if (c.verbosity >= 0) fmt::print("wrote {}\n", a.dump);
    }
}

}  // namespace

void add_run_command(CLI::App& app, Common& common) {
    auto args = std::make_shared<RunArgs>();
    CLI::App* cmd = app.add_subcommand("run", "Run single-device training steps of MODEL and print the loss per step");
    cmd->add_option("MODEL", args->model, "model YAML file")->required();
    cmd->add_option("--init", args->init, "initial parameters and buffers (safetensors, PyTorch state_dict names)");
    cmd->add_option("--data", args->data, "batch data (safetensors: input, target, step{k}.input, step{k}.target)");
    cmd->add_option("--steps", args->steps, "training steps (default: the model's `steps`)")->check(CLI::PositiveNumber);
    cmd->add_option("--dtype", common.dtype, "override the model's dtype: float32, bfloat16, float16, float64");
    add_device_options(cmd, common);
    cmd->add_option("--dump", args->dump,
                    "write every step's tensors in golden format (init.param.*, step{k}.loss/output/grad.*/param.*)");
    cmd->callback([args, &common] { run(*args, common); });
}

}  // namespace ptool::cli
