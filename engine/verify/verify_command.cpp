// `ptool verify` as the command line names it (verify_command.h): every file read and checked
// before any rank starts, then golden replay or verify itself. Above golden replay: verify.cpp holds
// the core, which golden replay runs.
#include "verify/verify_command.h"

#include <algorithm>

#include "core/files.h"
#include "core/yaml_reader.h"
#include "model/batch.h"
#include "model/checkpoint.h"

namespace ptool {
namespace {

// Every file of a MODEL PLAN... command, read and checked; the job's inputs point into it.
struct LoadedCommand {
    VerifyJob job;
    std::unique_ptr<TensorFile> init, data;
    std::unique_ptr<GoldenCase> golden;
};

LoadedCommand load_command(const VerifyCommand& cmd) {
    LoadedCommand l;
    if (!cmd.golden.empty()) {
        if (cmd.plans.size() != 1) throw InputError("--golden compares one plan");
        l.golden = std::make_unique<GoldenCase>(load_golden(cmd.golden));
    }
    RunInputs& in = l.job.inputs;
    in.model_path = cmd.model;
    in.model_text = read_file(cmd.model, YamlLimits{}.max_bytes);
    // against a golden, in the dtype it was recorded in unless told otherwise (golden_replay.h)
    in.dtype_override = cmd.dtype.empty() && l.golden ? l.golden->dtype : cmd.dtype;
    in.device = cmd.device;
    // a bad model: exit 2 before any rank starts; parsed once, for every check here and verify's lint
    l.job.model =
        std::make_shared<const Model>(load_model_text(in.model_text, cmd.model, in.dtype_override, false));
    if (!cmd.init.empty())
        l.init = std::make_unique<TensorFile>(read_checkpoint(cmd.init)), in.init = l.init.get(),
        in.init_path = cmd.init;
    if (!cmd.data.empty())
        l.data = std::make_unique<TensorFile>(read_safetensors(cmd.data)), in.data = l.data.get(),
        in.data_path = cmd.data;
    for (const auto& p : cmd.plans) l.job.plans.push_back(load_plan(p));
    for (Plan& p : l.job.plans) apply_mesh_flags(p, cmd.mesh);
    l.job.options = cmd.options;
    if (l.data) {
        int64_t steps = 0;
        for (const Plan& p : l.job.plans)
            steps = std::max(steps, steps_for(p, cmd.options, l.job.model->steps));
        check_data_steps(*l.data, cmd.data, steps);
    }
    return l;
}

}  // namespace

int run_verify_command(const VerifyCommand& cmd, const std::function<void(const VerifyReport&)>& on_report,
                       const std::function<void(const CaseResult&)>& on_case) {
    ReplayOptions replay;
    replay.update = cmd.update;
    replay.verify = cmd.options;
    if (looks_like_golden_arg(cmd.model)) {  // ptool verify golden/ [more files or folders]: in one process
        std::vector<std::string> args = {cmd.model};
        args.insert(args.end(), cmd.plans.begin(), cmd.plans.end());
        if (!cmd.init.empty() || !cmd.data.empty() || !cmd.golden.empty() || !cmd.mesh.empty())
            throw InputError(
                "golden files replay their own init, data and plan: --init, --data, --golden and --mesh "
                "apply to MODEL PLAN...");
        // a golden is re-recorded whole: one updated with other steps would keep its metadata's
        // steps over another count of recorded steps (a replay of it then refused as damaged)
        if (cmd.update && cmd.options.steps)
            throw InputError(
                "--update re-records each golden with the steps it was recorded with: --steps replays "
                "fewer or more (drop --steps to update, or replay with --steps without --update)");
        const auto launch = make_launch(cmd.device, cmd.options.comm);
        return launch->exit_code([&] {
            if (!launch->rank0()) return 0;  // the other ranks of an mpirun job wait for rank 0's verdict
            int bad = 0, refused = 0;
            for (const CaseResult& r : replay_golden_files(args, replay, cmd.device, cmd.dtype, on_case)) {
                bad += r.verdict == Verdict::fail || r.verdict == Verdict::stale;
                refused += r.verdict == Verdict::refused;
            }
            return refused ? 2 : bad ? 1 : 0;  // a refused case is bad input, whatever the others did
        });
    }
    if (cmd.plans.empty()) throw InputError("verify needs MODEL PLAN... (or golden files / folders)");
    if (!cmd.golden.empty() && (!cmd.init.empty() || !cmd.data.empty()))  // (they were ignored: a PASS)
        throw InputError(
            "--golden replays the golden's own init and data (a compact one ptool's seeded ones): drop "
            "--init "
            "and --data, or record a golden with them");
    if (cmd.update) throw InputError("--update applies to `ptool verify GOLDEN...`");
    const LoadedCommand l = load_command(cmd);
    const auto launch = make_launch(cmd.device, cmd.options.comm);
    return launch->exit_code([&] {
        if (l.golden) {  // three-way: parallel vs reference, reference vs golden, parallel vs golden
            const CaseResult r = replay_case(*l.golden, l.job.inputs, l.job.plans[0], replay, *launch);
            if (launch->rank0() && on_case) on_case(r);
            return r.verdict == Verdict::pass ? 0 : 1;
        }
        const VerifyReport report = verify(l.job, *launch);
        if (launch->rank0() && on_report) on_report(report);
        return report.pass ? 0 : 1;
    });
}

}  // namespace ptool
