// ptool verify MODEL PLAN...: reference vs parallel parity, one reference for every plan.
// In-process on rank threads, or one rank per process under mpirun.
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/golden_replay.h"
#include "cli/verify_output.h"
#include "comm/comm_mpi.h"
#include "comm/comm_nccl.h"
#include "core/safetensors.h"
#include "core/yaml_reader.h"
#include "verify/verify.h"

namespace ptool::cli {
namespace {

struct VerifyArgs {
    std::string model, init, data, json, golden, junit;
    bool update = false;
    std::vector<std::string> plans, mesh;
    int64_t steps = 0;
    double rtol = -1, atol = -1, timeout = 300;
    bool no_check = false;
};

int verify(const VerifyArgs& a, const Common& c) {
    GoldenOptions gopt;
    gopt.junit = a.junit, gopt.json = a.json, gopt.update = a.update;
    gopt.verify.steps = a.steps;
    if (a.rtol >= 0) gopt.verify.rtol = a.rtol;
    if (a.atol >= 0) gopt.verify.atol = a.atol;
    gopt.verify.comm.timeout_seconds = a.timeout;
    gopt.verify.comm.check_consistency = !a.no_check;
    if (looks_like_golden_arg(a.model)) {  // ptool verify golden/ [more files or folders]
        std::vector<std::string> args = {a.model};
        args.insert(args.end(), a.plans.begin(), a.plans.end());
        return verify_golden_files(args, gopt, c);
    }
    if (a.plans.empty()) throw InputError("verify needs MODEL PLAN... (or golden files / folders)");
    if (!a.junit.empty() || a.update) throw InputError("--junit and --update apply to `ptool verify GOLDEN...`");
    VerifyInputs in;
    in.model_path = a.model;
    in.model_text = read_text_file(a.model, YamlLimits{}.max_bytes);
    in.dtype_override = c.dtype;
    in.device = select_device(c);
    const Model probe = load_model_text(in.model_text, a.model, c.dtype, false);  // bad model: exit 2 before any rank starts
    TensorFile init, data;
    if (!a.init.empty()) init = read_safetensors(a.init), in.init = &init, in.init_path = a.init;
    if (!a.data.empty()) data = read_safetensors(a.data), in.data = &data, in.data_path = a.data;
    std::vector<Plan> plans;
    for (const auto& p : a.plans) plans.push_back(load_plan(p));
    for (const auto& m : a.mesh) {  // --mesh tp=8: resize a mesh dim of every plan
        const size_t eq = m.find('=');
        int size = 0;
        try {
            size = eq == std::string::npos ? 0 : std::stoi(m.substr(eq + 1));
        } catch (const std::exception&) {
        }
        if (size <= 0 || size > 4096) throw InputError(fmt::format("--mesh '{}': expected NAME=SIZE, e.g. tp=8", m));
        for (Plan& p : plans) {
            bool found = false;
            for (MeshDim& d : p.mesh)
                if (d.name == m.substr(0, eq)) d.size = size, found = true;
            if (!found) throw InputError(p.mesh_where, fmt::format("--mesh {}: the plan has no mesh dim '{}'", m, m.substr(0, eq)));
            if (p.src_data_rank && *p.src_data_rank >= size) p.src_data_rank = 0;
        }
    }
    VerifyOptions opt;
    opt.steps = a.steps;
    if (a.rtol >= 0) opt.rtol = a.rtol;
    if (a.atol >= 0) opt.atol = a.atol;
    opt.comm.timeout_seconds = a.timeout;
    opt.comm.check_consistency = !a.no_check;

    if (launched_by_mpi()) {
        mpi_init_once();
        MpiCommunicator world(MPI_COMM_WORLD, opt.comm);
        int code = 3;
        try {
            // on GPUs the ranks' collectives go through NCCL, bootstrapped over MPI
            std::unique_ptr<Communicator> gpus = in.device == Device::cuda ? make_nccl_world(world, opt.comm) : nullptr;
            VerifyReport report = verify_on_world(gpus ? *gpus : world, in, plans, opt);
            code = report.pass ? 0 : 1;
            if (world.rank() == 0) {
                print_report(report, a.model, probe, c.verbosity);
                if (!a.json.empty()) write_json_report(report, a.model, a.json);
            }
        } catch (const InputError& e) {
            mpi_abort_job(e.what(), 2);
        } catch (const std::exception& e) {
            const std::string what = e.what();
            mpi_abort_job(what.rfind("rank ", 0) == 0 || what.rfind("collective", 0) == 0
                              ? what
                              : fmt::format("rank {} failed: {}", world.rank(), what),
                          3);
        }
        Tensor t = Tensor::scalar(code, DType::float32);  // every process exits with rank 0's verdict
        world.broadcast(t, 0);
        return static_cast<int>(t.item());
    }
    if (!a.golden.empty()) {  // three-way: parallel vs reference, reference vs golden, parallel vs golden
        if (plans.size() != 1) throw InputError("--golden compares one plan");
        GoldenCase g = load_golden(a.golden);
        CaseResult r = replay_case(g, in, plans[0], gopt, c);
        for (const auto& d : r.directions) {
            if (c.verbosity >= 0) fmt::print("{}:\n", d.plan_path), print_table(d, c.verbosity);
            fmt::print("{}: {} {}/{} tensors agree\n", d.plan_path, d.pass ? "PASS" : "FAIL", d.passed, d.passed + d.failed);
        }
        if (!r.detail.empty()) fmt::print("  {}\n", r.detail);
        fmt::print("{}: {}\n", a.golden, r.verdict);
        return r.verdict == "PASS" ? 0 : 1;
    }
    VerifyReport report = verify_in_process(in, plans, opt);
    print_report(report, a.model, probe, c.verbosity);
    if (!a.json.empty()) write_json_report(report, a.model, a.json);
    return report.pass ? 0 : 1;
}

}  // namespace

void add_verify_command(CLI::App& app, Common& common, int& exit_code) {
    auto a = std::make_shared<VerifyArgs>();
    CLI::App* cmd = app.add_subcommand(
        "verify", "Run MODEL on one device and under each PLAN, and compare outputs, losses, gradients and parameters");
    cmd->add_option("MODEL", a->model, "model YAML file, or golden files / folders to replay (the CI form)")->required();
    cmd->add_option("PLAN", a->plans, "plan YAML files (one reference run serves them all)");
    cmd->add_option("--init", a->init, "initial parameters and buffers (safetensors, PyTorch state_dict names)");
    cmd->add_option("--data", a->data, "batch data (safetensors: input, target, step{k}.input, step{k}.target)");
    cmd->add_option("--steps", a->steps, "training steps (default: the plan's verify.steps, else the model's)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--dtype", common.dtype, "override the model's dtype");
    add_device_options(cmd, common);
    cmd->add_option("--rtol", a->rtol, "relative tolerance (default: the plan's, else torch.testing's for the dtype)");
    cmd->add_option("--atol", a->atol, "absolute tolerance");
    cmd->add_option("--json", a->json, "write the results as JSON");
    cmd->add_option("--golden", a->golden, "also compare reference and parallel results with this golden file");
    cmd->add_option("--junit", a->junit, "with golden files: write JUnit XML, one testcase per case");
    cmd->add_flag("--update", a->update, "with golden files: re-record cases whose numbers moved (model and plan unchanged)");
    cmd->add_option("--mesh", a->mesh, "resize a mesh dim of every plan, e.g. --mesh tp=8 (repeatable)");
    cmd->add_option("--timeout", a->timeout, "seconds a rank may wait in one collective (default 300)")
        ->check(CLI::PositiveNumber);
    cmd->add_flag("--no-collective-check", a->no_check, "skip comparing (op, dtype, shape, sequence) across ranks");
    cmd->callback([a, &common, &exit_code] { exit_code = verify(*a, common); });
}

}  // namespace ptool::cli
