// ptool explain MODEL PLAN: lint the plan and show what it does per rank, without running ranks.
#include "cli/commands.h"
#include "cli/explain_output.h"
#include "core/file_roles.h"
#include "core/yaml_reader.h"
#include "plan/cluster.h"

namespace ptool::cli {
namespace {

struct ExplainArgs {
    std::string model, plan, json, cluster;
    std::vector<std::string> mesh;
};

void explain(const ExplainArgs& a, const Common& c) {
    // the kernel table the cluster names is an input too (explain_report loads the cluster again)
    const std::string kernels = a.cluster.empty() ? "" : load_cluster(a.cluster).kernels_path;
    FileRoles()
        .input("MODEL", a.model)
        .input("PLAN", a.plan)
        .input("--cluster", a.cluster)
        .input("--cluster's kernels", kernels)
        .output("--json", a.json)
        .check();
    if (!a.json.empty()) check_output(a.json, true);
    ExplainInputs in;
    in.model_path = a.model;
    in.model_text = read_file(a.model, YamlLimits{}.max_bytes);
    in.dtype = c.dtype;
    in.plan_path = a.plan;
    in.mesh = a.mesh;
    in.cluster_path = a.cluster;
    const ExplainReport r = explain_report(in);
    print_explain(r, a.model, a.plan);
    if (!a.json.empty()) write_file(a.json, explain_json(r, a.model, a.plan).dump(2) + "\n", true);
}

}  // namespace

void add_explain_command(CLI::App& app, Common& common) {
    auto a = std::make_shared<ExplainArgs>();
    CLI::App* cmd = app.add_subcommand(
        "explain",
        "Lint PLAN for MODEL, then show styles, placements, local shapes, collectives and memory per rank");
    cmd->add_option("MODEL", a->model, "model YAML file")->required();
    cmd->add_option("PLAN", a->plan, "plan YAML file")->required();
    cmd->add_option("--dtype", common.dtype, "override the model's dtype");
    cmd->add_option("--json", a->json, "write the collectives and memory as JSON")->check(output_path());
    cmd->add_option("--cluster", a->cluster, "predict the step time on this cluster (clusters/*.yaml)");
    cmd->add_option("--mesh", a->mesh, "resize a mesh dim of the plan, e.g. --mesh tp=8 (repeatable)");
    cmd->callback([a, &common] { explain(*a, common); });
}

}  // namespace ptool::cli
