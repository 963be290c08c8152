// ptool verify MODEL PLAN... | GOLDEN...: options and printing; the engine (verify/verify.h) runs
// it, in-process or under mpirun alike.
#include "verify/verify_command.h"

#include <spdlog/spdlog.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/verify_output.h"
#include "core/file_roles.h"
#include "core/progress.h"
#include "core/safetensors.h"

namespace ptool::cli {
namespace {

struct VerifyArgs {
    VerifyCommand cmd;
    std::string json, junit, csv, html;
    double rtol = -1, atol = -1;
    bool no_check = false;
    bool reference_first = false;
    bool no_tie_replay = false;
};

void print_case(const CaseResult& r, bool three_way, int verbosity) {
    if (r.verdict == Verdict::refused) {  // the error as any input error's, then the case's line
        spdlog::error("{}", r.detail);
        fmt::print("{}: {}\n", r.path, verdict_name(r.verdict));
        return;
    }
    if (!three_way) {
        fmt::print("{}: {} ({} ranks, {:.0f} ms){}{}\n", r.path, verdict_name(r.verdict), r.world_size,
                   r.seconds * 1e3, r.detail.empty() ? "" : " · ", r.detail);
        for (const std::string& c : r.causes) fmt::print("  {}\n", c);
        return;
    }
    for (const auto& d : r.directions) {
        if (verbosity >= 0) fmt::print("{}:\n", d.plan_path), print_table(d, verbosity);
        fmt::print("{}: {} {}/{} tensors agree\n", d.plan_path, d.pass ? "PASS" : "FAIL", d.passed,
                   d.passed + d.failed);
    }
    if (!r.detail.empty()) fmt::print("  {}\n", r.detail);
    for (const std::string& c : r.causes) fmt::print("  {}\n", c);
    fmt::print("{}: {}\n", r.path, verdict_name(r.verdict));
}

// `verify MODEL PLAN --golden FILE`: the case's three comparisons (parallel vs reference, reference
// vs golden, parallel vs golden) as the report's plans, for --json, --junit, --csv and --report.
VerifyReport case_report(const CaseResult& r) {
    VerifyReport report;
    report.dtype = r.dtype;
    report.plans = r.directions;
    report.reference_seconds = r.reference_seconds;
    report.pass = r.verdict == Verdict::pass;
    return report;
}

// All or none (core/files.h's OutputGroup): one that fails leaves none of the others written.
void write_outputs(const VerifyArgs& a, const VerifyReport& report, const std::string& model_path) {
    OutputGroup group;
    if (!a.json.empty()) write_json_report(report, model_path, a.json);
    if (!a.junit.empty()) write_junit_report(report, model_path, a.junit);
    if (!a.csv.empty()) write_csv_report(report, a.csv);
    if (!a.html.empty()) write_html_report(report, model_path, a.html);
    group.commit();
}

// Every file the command reads and writes, by role: an output naming an input or another output
// is refused before anything runs.
void check_roles(const VerifyArgs& a, bool replay) {
    const VerifyCommand& cmd = a.cmd;
    FileRoles roles;
    if (replay) {
        std::vector<std::string> args = {cmd.model};
        args.insert(args.end(), cmd.plans.begin(), cmd.plans.end());
        for (const std::string& g : golden_paths(args)) {
            roles.input("the golden file", g);
            // the files its metadata names, compared with the recorded texts (read when they are
            // the same size): `verify G --json <G's model_path>` replaced the model
            const std::map<std::string, std::string> md = peek_safetensors_metadata(g);
            for (const char* key : {"model_path", "plan_path"})
                if (auto it = md.find(key); it != md.end() && it->second.find('\0') == std::string::npos)
                    roles.input(fmt::format("{}'s {}", g, key), it->second);
        }
    } else {
        roles.input("MODEL", cmd.model);
        for (const std::string& p : cmd.plans) roles.input("PLAN", p);
    }
    roles.input("--init", cmd.init).input("--data", cmd.data).input("--golden", cmd.golden);
    roles.output("--json", a.json)
        .output("--junit", a.junit)
        .output("--csv", a.csv)
        .output("--report", a.html);
    roles.check();
}

int verify(VerifyArgs& a, const Common& c) {
    VerifyCommand& cmd = a.cmd;
    cmd.dtype = c.dtype;
    if (a.rtol >= 0) cmd.options.tolerance.rtol = a.rtol;
    if (a.atol >= 0) cmd.options.tolerance.atol = a.atol;
    cmd.options.comm.check_consistency = !a.no_check;
    cmd.options.reference_beside = !a.reference_first;
    cmd.options.replay_ties = !a.no_tie_replay;
    const bool replay = looks_like_golden_arg(cmd.model);
    if (replay && (!a.csv.empty() || !a.html.empty()))
        throw InputError("--csv and --report apply to `ptool verify MODEL PLAN...`");
    if (replay && cmd.options.strict)
        throw InputError(
            "--strict applies to `ptool verify MODEL PLAN...` (golden cases record their plans' lint)");
    check_roles(a, replay);
    for (const std::string& out : {a.json, a.junit, a.csv, a.html})
        if (!out.empty()) check_output(out, true);  // before the run, not after it
    cmd.device = select_device(c);
    cmd.options.fault = fault_from_environment();
    ProgressScope progress;  // phases on stderr as they happen (not with -q), their times at the end
    std::vector<CaseResult> cases;
    std::string model_path = cmd.model;
    const int code = run_verify_command(
        cmd,
        [&](const VerifyReport& report) {
            Progress::get().phase("report");
            print_report(report, model_path, c.verbosity);
            write_outputs(a, report, model_path);
        },
        [&](const CaseResult& r) {
            print_case(r, !replay, c.verbosity);
            cases.push_back(r);
        });
    if (replay && !cases.empty()) {  // rank 0 of the job
        std::map<Verdict, int> count;
        for (const auto& r : cases) ++count[r.verdict];
        const int refused = count[Verdict::refused];
        fmt::print("golden: {} cases: {} passed, {} failed, {} stale, {} updated{}\n", cases.size(),
                   count[Verdict::pass], count[Verdict::fail], count[Verdict::stale], count[Verdict::updated],
                   refused ? fmt::format(", {} refused", refused) : "");
        OutputGroup group;  // all or none
        if (!a.junit.empty()) write_junit(cases, a.junit);
        if (!a.json.empty()) write_cases_json(cases, a.json);
        group.commit();
    }
    if (!replay && !cases.empty())
        write_outputs(a, case_report(cases.front()), model_path);  // --golden: rank 0
    return code;
}

}  // namespace

void add_verify_command(CLI::App& app, Common& common, int& exit_code) {
    auto a = std::make_shared<VerifyArgs>();
    CLI::App* cmd = app.add_subcommand(
        "verify",
        "Run MODEL on one device and under each PLAN, and compare outputs, losses, gradients and parameters");
    cmd->add_option("MODEL", a->cmd.model,
                    "model YAML file, or golden files / folders to replay (the CI form)")
        ->required();
    cmd->add_option("PLAN", a->cmd.plans, "plan YAML files (one reference run serves them all)");
    cmd->add_option("--init", a->cmd.init,
                    "initial parameters and buffers (safetensors, PyTorch state_dict names)");
    cmd->add_option("--data", a->cmd.data,
                    "batch data (safetensors: input, target, step{k}.input, step{k}.target)");
    cmd->add_option("--steps", a->cmd.options.steps,
                    "training steps (default: the plan's verify.steps, else the model's)")
        ->transform(whole_number(1, kMaxSteps));
    cmd->add_option("--dtype", common.dtype, "override the model's dtype");
    add_device_options(cmd, common);
    cmd->add_option("--rtol", a->rtol,
                    "relative tolerance (default: the plan's, else torch.testing's for the dtype)")
        ->check(finite_non_negative());
    cmd->add_option("--atol", a->atol, "absolute tolerance")->check(finite_non_negative());
    cmd->add_option("--json", a->json, "write the results as JSON")->check(output_path());
    cmd->add_option("--golden", a->cmd.golden,
                    "also compare reference and parallel results with this golden file");
    cmd->add_option("--junit", a->junit,
                    "write JUnit XML: a testcase per plan and per failing tensor (golden files: per case)")
        ->check(output_path());
    cmd->add_option(
           "--report", a->html,
           "write a self-contained HTML report (heat map of error per module and step, collectives, mesh)")
        ->check(output_path());
    cmd->add_option("--csv", a->csv,
                    "write the per-module, per-step numbers the report's heat map draws, as CSV")
        ->check(output_path());
    cmd->add_flag("--strict", a->cmd.options.strict,
                  "lint warnings (a pattern matching nothing, an empty plan) are failures");
    cmd->add_flag("--update", a->cmd.update,
                  "with golden files: re-record cases whose numbers moved (model and plan unchanged)");
    cmd->add_option("--mesh", a->cmd.mesh, "resize a mesh dim of every plan, e.g. --mesh tp=8 (repeatable)");
    cmd->add_option("--timeout", a->cmd.options.comm.timeout_seconds,
                    "seconds a rank may wait in one collective (default 300)")
        ->check(finite_number(0, 1e6, true));
    cmd->add_flag("--no-collective-check", a->no_check,
                  "skip comparing (op, dtype, shape, sequence) across ranks");
    cmd->add_flag(
        "--reference-first", a->reference_first,
        "run the single-device reference before the ranks, not beside them (one model in memory at a time)");
    cmd->add_flag(
        "--no-tie-replay", a->no_tie_replay,
        "at near-ties the parallel run follows nothing of the reference's: mixtures of experts route "
        "every token by its own logits, float8 linears cast every value of their own (default: a "
        "near-tie routed otherwise takes the reference's experts, a float8 cast the reference's "
        "value where its own agrees within tolerance)");
    cmd->callback([a, &common, &exit_code] { exit_code = verify(*a, common); });
}

}  // namespace ptool::cli
