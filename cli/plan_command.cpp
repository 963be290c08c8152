// ptool plan MODEL --cluster FILE: search how to run MODEL on a cluster (plan/search.h), print the
// fastest plans that fit and why the other shapes do not, and write the best as a plan YAML.
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/verify_output.h"
#include "comm/collective.h"
#include "core/file_roles.h"
#include "core/files.h"
#include "core/temp_paths.h"
#include "core/yaml_reader.h"
#include "core/yaml_writer.h"
#include "plan/search.h"
#include "train/simulate.h"
#include "verify/verify_command.h"

namespace ptool::cli {
namespace {

struct PlanArgs {
    std::string model, cluster, output, json, mixed_precision = "bfloat16", pipelines = "auto",
                                              float8 = "never";
    bool verify = false;
    int world_size = 0, top = 5;
    double memory_cap_gib = 0;
};

std::string seconds_str(double s) {
    return s >= 1      ? fmt::format("{:.2f} s", s)
           : s >= 1e-3 ? fmt::format("{:.1f} ms", s * 1e3)
                       : fmt::format("{:.0f} us", s * 1e6);
}

std::string header(const PlanArgs& a, const Cluster& cl, const SearchResult& r, const Candidate& c) {
    std::string s = fmt::format(
        "# Written by `ptool plan {} --cluster {} --world-size {}`: the fastest of {} fitting candidates.\n"
        "# Predicted per GPU on {}: allocated {}, reserved {} and runtime {} of {} (PyTorch's step: "
        "docs/planning.md),\n"
        "# step {:.0f} ms (compute {:.0f} ms, blocking collectives {:.0f} ms, data-parallel {:.0f} ms "
        "overlapped), MFU {:.1f}%.\n",
        yaml_comment(a.model), yaml_comment(a.cluster), r.world_size, r.fitting.size(),
        yaml_comment(cl.name),  // names in comments: one printable line
        format_bytes(static_cast<int64_t>(c.peak)), format_bytes(static_cast<int64_t>(c.reserved)),
        format_bytes(static_cast<int64_t>(c.runtime)), format_bytes(static_cast<int64_t>(r.memory_cap)),
        c.time.step * 1e3, c.time.compute * 1e3, c.time.blocking * 1e3, c.time.overlappable * 1e3,
        100 * c.mfu);
    if (c.choice.gradient_accumulation > 0)  // the plan says it: explain and verify read it over the model's
        s += fmt::format(
            "# Gradient accumulation: {} microbatches a step where the model says {}: the plan's "
            "`gradient_accumulation: {}` overrides it.\n",
            c.choice.gradient_accumulation, c.model_microbatches, c.choice.gradient_accumulation);
    if (c.choice.pp > 1)
        s += fmt::format(
            "# Pipeline: {} stages of [{}] blocks (balanced by predicted time), {} microbatches a round; "
            "critical path {:.0f} ms, bubble {:.1f}%.\n",
            c.choice.pp * c.choice.virtual_stages, fmt::join(c.choice.stage_blocks, ", "),
            c.choice.pp_microbatches, c.time.pipeline * 1e3, 100 * c.time.bubble);
    if (c.choice.float8)
        s += fmt::format(
            "# float8 {} (torchao's Float8Linear as torchtitan converts: every linear but the output "
            "head){}, "
            "with torch.compile:\n# its casts priced fused (docs/float8.md).\n",
            float8_scaling_name(*c.choice.float8),
            c.choice.float8_all_gather() ? "; fully_shard gathers the weights in float8, scales precomputed"
                                         : "");
    s += "# Check it before the cluster: `ptool explain MODEL THIS_PLAN` (lint, memory per rank).\n";
    return s;
}

// The best plan on a proxy of the model (plan/shrink.h), verified here: exit code as verify's.
int verify_on_proxy(const PlanArgs& a, const Candidate& best, const Common& common) {
    const TempDir tmp("ptool-plan");  // removed at the end, and on SIGINT, SIGTERM or SIGHUP
    const std::string& dir = tmp.path();
    const std::string real_plan = a.output.empty() ? dir + "/plan.yaml" : a.output;
    if (a.output.empty()) write_file(real_plan, best.plan_text, true);
    std::string plan_path = real_plan;
    if (best.choice.pp > 1) {  // the proxy has a block per stage: the same stages, schedule and microbatches
        std::istringstream in(best.plan_text);
        std::string text, line;
        while (std::getline(in, line))
            text += (line.rfind("  split_points:", 0) == 0 || line.rfind("  layers_per_stage:", 0) == 0
                         ? std::string("  layers_per_stage: 1")
                         : line) +
                    "\n";
        plan_path = dir + "/proxy_plan.yaml";
        write_file(plan_path, text, true);
    }
    // the plan carries the accumulation it needs (gradient_accumulation): the proxy of the model as
    // written runs it; shrink holds the plan as written to the real model (its stages, its rows)
    const std::string proxy = dir + "/proxy.yaml";
    write_file(proxy, shrunk_model_checked(a.model, real_plan), true);
    fmt::print(
        "\n  verifying the best plan on a proxy of the model (ptool shrink: 2 blocks, small widths that "
        "split alike):\n");
    VerifyCommand cmd;
    cmd.model = proxy;
    cmd.plans = {plan_path};
    cmd.device = select_device(common);
    cmd.options.fault = fault_from_environment();
    return run_verify_command(
        cmd, [&](const VerifyReport& report) { print_report(report, proxy, common.verbosity); },
        [](const CaseResult&) {});
}

// --float8 offer: the fastest plan with float8 against the fastest without, and against its own
// shape (mesh, data parallel, checkpointing, schedule) without float8 where that fits.
void print_float8_gain(const SearchResult& r) {
    const Candidate *with = nullptr, *without = nullptr;  // the fastest of each (r.fitting: fastest first)
    for (const Candidate& c : r.fitting) {
        const Candidate*& best = c.choice.float8 ? with : without;
        if (!best) best = &c;
    }
    if (!with || !without) {
        fmt::print("\n  float8: {}\n", with ? "no plan without it fits" : "no float8 plan fits");
        return;
    }
    auto shape = [](const PlanChoice& c) {
        return fmt::format("{} {} {} {} {}", c.mesh_text(), c.mode_name(), c.checkpoint_mode(),
                           schedule_kind_name(c.schedule), c.virtual_stages);
    };
    const Candidate* same = nullptr;
    for (const Candidate& c : r.fitting)
        if (!same && !c.choice.float8 && shape(c.choice) == shape(with->choice)) same = &c;
    fmt::print(
        "\n  float8 tensorwise (compiled): the fastest plan with it {} a step, without it {} (speed-up "
        "x{:.2f})",
        seconds_str(with->time.step), seconds_str(without->time.step), without->time.step / with->time.step);
    if (same && same != without)
        fmt::print("; its own shape without float8 {} (x{:.2f})", seconds_str(same->time.step),
                   same->time.step / with->time.step);
    fmt::print("\n");
}

// The fastest `top` fitting candidates as a table (an all_to_all column where one has experts).
void print_candidates(const SearchResult& r, int top) {
    std::vector<std::vector<std::string>> rows = {{"#", "mesh", "data parallel", "pipeline", "checkpoint",
                                                   "micro", "peak", "on the GPU", "comm/step", "compute",
                                                   "step", "MFU"}};
    // expert parallel candidates listed: their all_to_alls' time (blocking, part of the step) beside
    bool experts = false;
    for (size_t i = 0; i < r.fitting.size() && static_cast<int>(i) < top; ++i)
        experts |= r.fitting[i].choice.ep > 1;
    if (experts) rows[0].insert(rows[0].end() - 2, collective_name(Collective::all_to_all));
    const bool float8 = r.float8 != Float8Search::never;  // a column only where the search offered float8
    if (float8) rows[0].insert(rows[0].begin() + 5, "float8");
    for (size_t i = 0; i < r.fitting.size() && static_cast<int>(i) < top; ++i) {
        const Candidate& c = r.fitting[i];
        double bytes = 0;
        for (const auto& [dim, ct] : c.time.by_dim) bytes += ct.bytes;
        rows.push_back(
            {std::to_string(i + 1), c.choice.mesh_text(),
             c.choice.dp > 1 || c.choice.cp > 1 ? c.choice.mode_name() : "-",
             c.choice.pp > 1
                 ? fmt::format(
                       "{}{} m{}, bubble {:.0f}%", schedule_kind_name(c.choice.schedule),
                       c.choice.virtual_stages > 1 ? fmt::format(" v{}", c.choice.virtual_stages) : "",
                       c.choice.pp_microbatches, 100 * c.time.bubble)
                 : "-",
             c.choice.checkpoint ? c.choice.checkpoint_mode() : "no", std::to_string(c.microbatches),
             format_bytes(static_cast<int64_t>(c.peak)),
             format_bytes(static_cast<int64_t>(c.reserved + c.runtime)),
             format_bytes(static_cast<int64_t>(bytes)), seconds_str(c.time.compute), seconds_str(c.time.step),
             fmt::format("{:.1f}%", 100 * c.mfu)});
        if (experts)
            rows.back().insert(rows.back().end() - 2, c.choice.ep > 1 ? seconds_str(c.time.all_to_all) : "-");
        if (float8)
            rows.back().insert(rows.back().begin() + 5,
                               c.choice.float8 ? float8_scaling_name(*c.choice.float8) : "-");
    }
    fmt::print("\n");
    if (r.fitting.empty())
        fmt::print("  no candidate fits\n");
    else
        print_columns(rows, "  ");
    if (r.float8 == Float8Search::offer) print_float8_gain(r);
}

// The rejected candidates by kind: a count and the first of each; every one under -v.
void print_rejections(const SearchResult& r, int verbosity) {
    if (r.rejected.empty()) return;
    fmt::print("\n  rejected ({}):\n", r.rejected.size());
    for (const RejectionGroup& g : group_rejections(r.rejected)) {
        fmt::print("    {}: {}\n", g.kind->title, g.count);
        if (verbosity > 0) {
            for (const Rejection& j : r.rejected)
                if (j.kind == g.kind->kind) fmt::print("      {}: {}\n", j.shape, j.reason);
        } else {
            fmt::print("      {}: {}{}\n", g.first->shape, g.first->reason,
                       g.count > 1 ? fmt::format(" (and {} more)", g.count - 1) : "");
        }
    }
    if (verbosity == 0) fmt::print("    (-v lists every rejected candidate)\n");
}

nlohmann::json candidate_json(const Candidate& c) {
    nlohmann::json e = {{"dp", c.choice.dp},
                        {"tp", c.choice.tp},
                        {"cp", c.choice.cp},
                        {"mode", data_parallel_mode_name(c.choice.dp_mode)},
                        {"zero_stage", c.choice.zero_stage},
                        {"activation_checkpointing", c.choice.checkpoint},
                        {"activation_checkpointing_mode", c.choice.checkpoint_mode()},
                        {"microbatches", c.microbatches},
                        {"peak_bytes", c.peak},
                        {"reserved_bytes", c.reserved},
                        {"runtime_bytes", c.runtime},
                        {"memory_simulated_whole", c.whole},
                        {"step_seconds", c.time.step},
                        {"compute_seconds", c.time.compute},
                        {"blocking_seconds", c.time.blocking},
                        {"overlappable_seconds", c.time.overlappable},
                        {"mfu", c.mfu},
                        {"plan", c.plan_text}};
    if (c.choice.hybrid()) e["dp_replicate"] = c.choice.dp_replicate(), e["dp_shard"] = c.choice.dp_shard;
    if (c.choice.ep > 1)
        e["ep"] = c.choice.ep, e["ep_mesh_dim"] = c.choice.ep_mesh_dim(),
        e["all_to_all_seconds"] = c.time.all_to_all;
    if (c.choice.float8)
        e["float8"] = {{"recipe", float8_scaling_name(*c.choice.float8)},
                       {"enable_fsdp_float8_all_gather", c.choice.float8_all_gather()},
                       {"compile", true}};
    if (c.choice.pp > 1)
        e["pipeline"] = {{"pp", c.choice.pp},
                         {"schedule", schedule_kind_name(c.choice.schedule)},
                         {"virtual_stages", c.choice.virtual_stages},
                         {"microbatches", c.choice.pp_microbatches},
                         {"stage_blocks", c.choice.stage_blocks},
                         {"pipeline_seconds", c.time.pipeline},
                         {"bubble", c.time.bubble}};
    return e;
}

nlohmann::json plan_json(const PlanArgs& a, const Cluster& cluster, const SearchResult& r, double seconds) {
    nlohmann::json j = json_document("plan");
    j["model"] = a.model, j["cluster"] = cluster.name, j["world_size"] = r.world_size;
    j["memory_cap_bytes"] = r.memory_cap, j["evaluated"] = r.evaluated, j["seconds"] = seconds;
    if (r.float8 != Float8Search::never) j["float8"] = float8_search_name(r.float8);  // --float8
    j["candidates"] = nlohmann::json::array();
    for (const Candidate& c : r.fitting) j["candidates"].push_back(candidate_json(c));
    j["rejected"] = nlohmann::json::array();
    for (const Rejection& x : r.rejected)
        j["rejected"].push_back(
            {{"shape", x.shape}, {"reason", x.reason}, {"kind", rejection_kind_info(x.kind).name}});
    return j;
}

int plan(const PlanArgs& a, const Common& common) {
    const Cluster cluster = load_cluster(a.cluster);  // first: the kernel table it names is an input
    FileRoles()
        .input("MODEL", a.model)
        .input("--cluster", a.cluster)
        .input("--cluster's kernels", cluster.kernels_path)
        .output("-o", a.output)
        .output("--json", a.json)
        .check();
    if (!a.output.empty()) check_output(a.output, true);
    if (!a.json.empty()) check_output(a.json, true);
    SearchOptions o;
    o.world_size = a.world_size;
    o.keep = a.top;
    o.pipelines = a.pipelines;
    o.float8 = float8_search_named(a.float8).value();  // CLI11 checked it against the names
    o.memory_cap = a.memory_cap_gib * (1ull << 30);
    if (a.mixed_precision != "none")
        o.param_dtype = dtype_name(parse_dtype(a.mixed_precision));
    else
        o.param_dtype.reset();
    const std::string text = read_file(a.model, YamlLimits{}.max_bytes);
    const auto t0 = std::chrono::steady_clock::now();
    const SearchResult r = search_plans(text, a.model, cluster, o);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print(
        "ptool plan {} on {} ({} GPUs, {} per GPU{}; {} compute): {} candidates simulated in "
        "{:.2f} s\n",
        a.model, cluster.name, r.world_size, format_bytes(static_cast<int64_t>(r.memory_cap)),
        a.memory_cap_gib > 0 ? " for tensors" : " less each plan's runtime", dtype_name(r.compute),
        r.evaluated, seconds);
    if (!r.tp_unsupported.empty()) fmt::print("  no tensor parallelism: {}\n", r.tp_unsupported);
    if (!r.pipelines_skipped.empty()) fmt::print("  pipelines not searched: {}\n", r.pipelines_skipped);
    print_candidates(r, a.top);
    print_rejections(r, common.verbosity);
    fmt::print(
        "\n  (memory: rank 0 simulated for {} steps on meta tensors{}, and the listed plans simulated whole "
        "as "
        "explain does;\n"
        "   time: the cluster's rates, data-parallel collectives overlapped with the compute; a pipeline: pp "
        "ranks 0, 1\n"
        "   and the last at 4 and 5 blocks a stage, its step the schedule's critical path; "
        "docs/planning.md)\n",
        kSteadyStateSteps,
        !r.fitting.empty() && r.fitting[0].extrapolated ? ", the repeated blocks extrapolated from 4 and 5"
                                                        : "");
    if (!a.output.empty()) {
        if (r.fitting.empty())
            throw InputError(fmt::format("no candidate fits: {} is not written", a.output));
        write_file(a.output, header(a, cluster, r, r.fitting[0]) + r.fitting[0].plan_text, true);
        fmt::print("  wrote {}\n", a.output);
    }
    int code = 0;
    if (a.verify) {
        if (r.fitting.empty()) throw InputError("--verify: no candidate fits");
        code = verify_on_proxy(a, r.fitting[0], common);
    }
    if (!a.json.empty()) write_file(a.json, plan_json(a, cluster, r, seconds).dump(2) + "\n", true);
    return code;
}

}  // namespace

void add_plan_command(CLI::App& app, Common& common, int& exit_code) {
    auto a = std::make_shared<PlanArgs>();
    CLI::App* cmd = app.add_subcommand(
        "plan",
        "Search data x tensor x pipeline parallel plans for MODEL on a cluster, fastest that fit first");
    cmd->add_option("MODEL", a->model, "model YAML file")->required();
    cmd->add_option("--cluster", a->cluster, "cluster YAML file (clusters/*.yaml)")->required();
    cmd->add_option("--world-size", a->world_size, "GPUs to use (default: all the cluster's)")
        ->transform(whole_number(1, 1 << 20));
    cmd->add_option("--memory-cap", a->memory_cap_gib,
                    "GiB per GPU for tensors (default: the cluster's memory less its reserve)")
        ->check(finite_number(0, 1 << 20, true));
    cmd->add_option("--top", a->top, "plans to list (default 5)")->transform(whole_number(1, 1 << 20));
    cmd->add_option("--pipeline", a->pipelines,
                    "search pipelines: auto (when fewer than --top dp x tp plans fit), always or never")
        ->check(CLI::IsMember({"auto", "always", "never"}));
    cmd->add_option("--float8", a->float8,
                    "torchao's float8 linears, with torch.compile: never (default), tensorwise or rowwise "
                    "(every candidate), or offer (each without and with tensorwise)")
        ->check(CLI::IsMember(float8_search_names()));
    cmd->add_option("--mixed-precision", a->mixed_precision,
                    "compute dtype (param_dtype) or none (default bfloat16)");
    cmd->add_option("-o,--output", a->output, "write the best plan as YAML")->check(output_path());
    cmd->add_option("--json", a->json, "write every candidate and rejection as JSON")->check(output_path());
    cmd->add_flag("--verify", a->verify, "verify the best plan here on a proxy of the model (ptool shrink)");
    add_device_options(cmd, common);
    cmd->callback([a, &common, &exit_code] { exit_code = plan(*a, common); });
}

}  // namespace ptool::cli
