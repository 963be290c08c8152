// ptool golden record | show | diff.
#include <cmath>

#include "cli/commands.h"
#include "cli/verify_output.h"
#include "core/file_roles.h"
#include "core/yaml_reader.h"
#include "model/checkpoint.h"
#include "verify/golden.h"
#include "verify/golden_compact.h"

namespace ptool::cli {
namespace {

struct GoldenArgs {
    std::string model, plan, out, init, data, a, b;
    int64_t steps = 0, sample = 0;  // sample: --compact's (0: not given, 64)
    bool force = false, compact = false;
    double rtol = -1, atol = -1;
};

void record(const GoldenArgs& a, const Common& c) {
    if (!a.compact && a.sample > 0)  // (it was ignored: a full golden written)
        throw InputError("--sample applies to --compact goldens: add --compact or drop --sample");
    if (a.compact && (!a.init.empty() || !a.data.empty()))
        throw InputError(
            "--compact records no init or data (a compact case replays ptool's seeded init and batch): drop "
            "--init/--data");
    FileRoles()
        .input("MODEL", a.model)
        .input("PLAN", a.plan)
        .input("--init", a.init)
        .input("--data", a.data)
        .output("-o", a.out)
        .check();
    check_output(a.out, a.force);  // before the run, not after it
    RunInputs in;
    in.model_path = a.model;
    in.model_text = read_file(a.model, YamlLimits{}.max_bytes);
    in.dtype_override = c.dtype;
    in.device = select_device(c);  // a GPU-recorded golden says so in its metadata
    TensorFile init, data;
    if (!a.init.empty()) init = read_checkpoint(a.init), in.init = &init, in.init_path = a.init;
    if (!a.data.empty()) data = read_safetensors(a.data), in.data = &data, in.data_path = a.data;
    const Plan plan = load_plan(a.plan);
    VerifyOptions opt;
    opt.steps = a.steps;
    if (a.rtol >= 0) opt.tolerance.rtol = a.rtol;
    if (a.atol >= 0) opt.tolerance.atol = a.atol;
    const Model probe = load_model_text(in.model_text, a.model, c.dtype, false);
    if (in.data) check_data_steps(*in.data, a.data, steps_for(plan, opt, probe.steps));
    TensorFile file = record_golden(in, plan, opt);
    if (a.compact) file = compact_golden(file, a.sample > 0 ? a.sample : 64);
    write_safetensors(a.out, file, a.force);
    fmt::print("wrote {}: {} tensors, {} steps of {} x {}\n", a.out, file.tensors.size(),
               file.metadata["steps"], a.model, a.plan);
}

void show(const GoldenArgs& a) {
    TensorFile f = read_safetensors(a.a);
    fmt::print("{}\n", a.a);
    for (const auto& [k, v] : f.metadata) {
        if (k == "model_yaml" || k == "plan_yaml") continue;
        fmt::print("  {:<14} {}\n", k, v);
    }
    for (const char* k : {"model_yaml", "plan_yaml"})
        if (f.metadata.count(k))
            fmt::print("  {}:\n    {}\n", k, fmt::join(split_lines(f.metadata[k]), "\n    "));
    fmt::print("  {:<48} {:<9} {:<16} {}\n", "tensor", "dtype", "shape", "norm");
    for (const auto& [name, t] : f.tensors) {
        double sq = 0;
        for (double v : t.to_doubles()) sq += v * v;
        fmt::print("  {:<48} {:<9} {:<16} {:.6g}\n", name, dtype_name(t.dtype()), shape_str(t.shape()),
                   std::sqrt(sq));
    }
}

int diff(const GoldenArgs& a) {
    TensorFile x = read_safetensors(a.a), y = read_safetensors(a.b);
    const DType dt = x.tensors.empty() ? DType::float32 : x.tensors[0].second.dtype();
    Tolerance tol = Tolerance::for_dtype(dt);
    tol.rel_fro =
        0;  // the elementwise rule alone: without the model there is no depth to size the bf16 bound by
    if (a.rtol >= 0) tol.rtol = a.rtol;
    if (a.atol >= 0) tol.atol = a.atol;
    int differ = 0;
    fmt::print("  {:<48} {:>9} {:>9} {:>6} {:>9}  {}\n", "tensor", "max abs", "max rel", "ULP", "headroom",
               "verdict");
    for (const auto& [name, t] : x.tensors) {
        const Tensor* u = y.find(name);
        if (!u) {
            fmt::print("  {:<48} only in {}\n", name, a.a);
            ++differ;
            continue;
        }
        if (t.dtype() !=
            u->dtype()) {  // another dtype is another tensor (a cast would make 1.9 agree with 1)
            fmt::print("  {:<48} DTYPE: {} in {}, {} in {}\n", name, dtype_name(t.dtype()), a.a,
                       dtype_name(u->dtype()), a.b);
            ++differ;
            continue;
        }
        const TensorDiff d = compare_tensors(*u, t, tol);
        differ += !d.pass;
        // (headroom: thousands fixed, past a million in exponent form, not 300 digits)
        const double headroom = std::isinf(d.headroom) ? 1e9 : d.headroom;
        fmt::print("  {:<48} {:>9.2e} {:>9.2e} {:>6} {:>9}  {}\n", name, d.max_abs, d.max_rel, d.max_ulp,
                   headroom < 1e6 ? fmt::format("{:.3f}", headroom) : fmt::format("{:.3g}", headroom),
                   d.pass ? "ok" : (d.shape_ok ? "DIFFERS" : "SHAPE"));
    }
    size_t only_b = 0;  // the count is of both files' names ("31 of 25" counted one file's)
    for (const auto& [name, t] : y.tensors)
        if (!x.find(name)) fmt::print("  {:<48} only in {}\n", name, a.b), ++differ, ++only_b;
    fmt::print("{} vs {}: {} of {} tensors differ (rtol {:g}, atol {:g})\n", a.a, a.b, differ,
               x.tensors.size() + only_b, tol.rtol, tol.atol);
    return differ ? 1 : 0;
}

}  // namespace

std::vector<std::string> split_lines(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start < s.size()) {
        size_t nl = s.find('\n', start);
        if (nl == std::string::npos) nl = s.size();
        out.push_back(s.substr(start, nl - start));
        start = nl + 1;
    }
    return out;
}

void add_golden_command(CLI::App& app, Common& common, int& exit_code) {
    auto a = std::make_shared<GoldenArgs>();
    CLI::App* g = app.add_subcommand("golden", "Record, inspect and compare golden files");
    g->require_subcommand(1);
    CLI::App* rec =
        g->add_subcommand("record", "Run MODEL's reference for PLAN and write a golden file (atomically)");
    rec->add_option("MODEL", a->model, "model YAML file")->required();
    rec->add_option("PLAN", a->plan, "plan YAML file (recorded with the case)")->required();
    rec->add_option("-o,--output", a->out, "golden file to write (.safetensors)")
        ->required()
        ->check(output_path());
    rec->add_flag("--force", a->force, "replace an existing file");
    rec->add_option("--init", a->init, "initial parameters (safetensors state_dict)");
    rec->add_option("--data", a->data, "batch data (safetensors)");
    rec->add_option("--steps", a->steps, "steps (default: the plan's verify.steps, else the model's)")
        ->transform(whole_number(1, kMaxSteps));
    rec->add_option("--dtype", common.dtype, "override the model's dtype");
    add_device_options(rec, common);
    rec->add_flag("--compact", a->compact,
                  "record losses, per-tensor norms and a sample of elements, not whole tensors "
                  "(docs/file_formats.md: what it can and cannot catch)");
    rec->add_option("--sample", a->sample, "elements per tensor in a --compact golden (default 64)")
        ->transform(whole_number(1, 9999999));
    rec->add_option("--rtol", a->rtol, "tolerance recorded with the case")->check(finite_non_negative());
    rec->add_option("--atol", a->atol, "tolerance recorded with the case")->check(finite_non_negative());
    rec->callback([a, &common] { record(*a, common); });
    CLI::App* sh =
        g->add_subcommand("show", "Print a golden file's metadata and tensors (dtype, shape, norm)");
    sh->add_option("FILE", a->a, "golden file")->required();
    sh->callback([a] { show(*a); });
    CLI::App* df = g->add_subcommand("diff", "Compare two golden files tensor by tensor");
    df->add_option("A", a->a, "golden file")->required();
    df->add_option("B", a->b, "golden file")->required();
    df->add_option("--rtol", a->rtol, "relative tolerance (default: torch.testing's for the dtype)")
        ->check(finite_non_negative());
    df->add_option("--atol", a->atol, "absolute tolerance")->check(finite_non_negative());
    df->callback([a, &exit_code] { exit_code = diff(*a); });
}

}  // namespace ptool::cli
