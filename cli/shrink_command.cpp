// ptool shrink MODEL PLAN: write a proxy of MODEL that PLAN splits as it splits MODEL, small enough
// to verify here (plan/shrink.h).
#include "cli/commands.h"
#include "core/file_roles.h"
#include "core/files.h"
#include "core/yaml_reader.h"
#include "model/model.h"
#include "parallel/plan.h"
#include "plan/explain.h"
#include "plan/shrink.h"
#include "train/simulate.h"
#include "verify/loss_causes.h"

namespace ptool::cli {

std::string shrunk_model_checked(const std::string& model_path, const std::string& plan_path) {
    const std::string text = read_file(model_path, YamlLimits{}.max_bytes);
    Plan plan;
    {
        // the loader's errors, with positions in the real file
        auto meta = std::make_unique<MetaAllocation>();
        const Model real = load_model_text(text, model_path, "", false);
        plan = load_plan(plan_path);
        // the plan against the real model first, as verify of it would hold it (the proxy's sizes are
        // made to split, so a plan that does not fit the real batch, sequence or blocks would pass
        // on it): the microbatches, the resolution and lint (data ranks over the batch's rows, cp
        // over the sequence, the layout pass), what a run checks as it is built (its stages), and
        // the real batch's targets (the proxy's fewer, masked at most half, would have valid ones)
        check_microbatches(plan, real);
        explain_plan(real, plan);
        RunInputs in;
        in.model_path = model_path, in.model_text = text;
        check_run(in, plan, 0);
        meta.reset();  // the targets are counted on the host (a meta tensor reads zeros)
        require_valid_targets(real, plan, in, real.steps);
    }
    const std::string proxy = shrink_model(text, model_path, plan);
    const Model m = load_model_text(proxy, model_path + " (proxy)", "", false);
    explain_plan(m, plan);  // the plan's lint on the proxy: a plan that splits the model splits it
    return proxy;
}

void add_shrink_command(CLI::App& app) {
    auto model = std::make_shared<std::string>(), plan = std::make_shared<std::string>(),
         out = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "shrink", "Write a small proxy of MODEL that PLAN splits as it splits MODEL (to verify here)");
    cmd->add_option("MODEL", *model, "model YAML file")->required();
    cmd->add_option("PLAN", *plan, "plan YAML file")->required();
    cmd->add_option("-o,--output", *out, "write the proxy here (default: print it)")->check(output_path());
    cmd->callback([model, plan, out] {
        FileRoles().input("MODEL", *model).input("PLAN", *plan).output("-o", *out).check();
        if (!out->empty()) check_output(*out, true);
        const std::string proxy = shrunk_model_checked(*model, *plan);
        if (out->empty())
            fmt::print("{}", proxy);
        else
            write_file(*out, proxy, true),
                fmt::print("wrote {}: verify it with `ptool verify {} {}`\n", *out, *out, *plan);
    });
}

}  // namespace ptool::cli
