#include "verify/golden_replay.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/files.h"
#include "model/batch.h"
#include "verify/golden_compact.h"

namespace ptool {
namespace {

std::string worst(const PlanReport& r, size_t n) {
    std::vector<const TensorReport*> bad;
    for (const auto& t : r.tensors)
        if (!t.pass) bad.push_back(&t);
    std::sort(bad.begin(), bad.end(), [](auto* a, auto* b) { return a->diff.headroom > b->diff.headroom; });
    std::vector<std::string> parts;
    for (size_t i = 0; i < bad.size() && i < n; ++i)
        parts.push_back(bad[i]->diff.shape_ok
                            ? fmt::format("{} (max abs {:.3g}, headroom {:.3g})", bad[i]->name,
                                          bad[i]->diff.max_abs, bad[i]->diff.headroom)
                            : fmt::format("{} (missing or shape differs)", bad[i]->name));
    return fmt::format("{}", fmt::join(parts, "; "));
}

// The golden's recorded steps and tolerance, unless the command line says otherwise. The recorded
// rule is its dtype's: a replay in another dtype (verify --dtype) takes that dtype's defaults (a
// float32 golden replayed in bf16 was judged by float32's rtol and failed every case).
VerifyOptions case_options(const GoldenCase& c, VerifyOptions vo, DType run) {
    if (!vo.steps) vo.steps = c.steps;
    // the golden's recorded rule, where the command line's --rtol/--atol do not replace it (those
    // rule every tensor, masters too, elementwise)
    const bool own_dtype = c.dtype.empty() || parse_dtype(c.dtype) == run;
    Tolerance::Override o = own_dtype ? c.tolerance : Tolerance::Override{};
    if (vo.tolerance.rtol) o.rtol = vo.tolerance.rtol, o.master_rtol.reset(), o.rel_fro.reset();
    if (vo.tolerance.atol) o.atol = vo.tolerance.atol, o.master_atol.reset(), o.rel_fro.reset();
    vo.tolerance = o;
    return vo;
}

}  // namespace

CaseResult replay_case(const GoldenCase& c, const RunInputs& base, const Plan& plan, const ReplayOptions& opt,
                       Launch& launch) {
    const auto t0 = std::chrono::steady_clock::now();
    CaseResult res;
    res.path = c.path;
    res.world_size = plan.world_size();
    if (!c.stale.empty()) {  // nothing runs from an edited case
        res.verdict = Verdict::stale, res.detail = c.stale;
        return res;
    }
    // parsed once: the case's checks here and verify's lint (VerifyJob::model)
    const auto probe = std::make_shared<const Model>(
        load_model_text(base.model_text, base.model_path, base.dtype_override, false));
    const VerifyOptions options = case_options(c, opt.verify, probe->dtype);
    require_golden_tensors(c, *probe, steps_for(plan, options, probe->steps));
    TensorFile init, data;
    golden_inputs(c.file, init, data);
    VerifyJob job;
    job.inputs = base;
    job.model = probe;
    if (!c.compact_sample) {  // a compact case runs from ptool's seeded init and generated data
        job.inputs.init = &init, job.inputs.init_path = c.path + "[init.*]";
        job.inputs.data = &data, job.inputs.data_path = c.path + "[data]";
        job.golden = &c.file;  // the parallel run is compared with it as it records
    }
    job.plans = {plan};
    job.options = options;
    job.keep_reference = true;  // compared with the golden file below
    const VerifyReport vr = verify(job, launch);
    if (!launch.rank0()) return res;
    const Tolerance tol = vr.plans[0].tol;
    res.dtype = vr.dtype, res.reference_seconds = vr.reference_seconds;
    res.directions.push_back(vr.plans[0]);
    if (c.compact_sample) {  // parallel vs reference whole; the reference vs the golden's norms and samples
        res.directions.push_back(
            compare_with_compact(vr.reference, c.file, tol, "reference vs compact golden"));
    } else {
        res.directions.push_back(
            compare_with_golden(vr.reference, c.file, tol, "reference vs golden", probe->optimizer, true));
        res.directions.push_back(
            compare_with_golden(vr.plans[0].run, c.file, tol, "parallel vs golden", probe->optimizer, false));
    }
    res.directions[0].plan_path = "parallel vs reference";
    for (size_t i = 1; i < res.directions.size();
         ++i) {  // the run each golden comparison judges: its world and backend, not its steps
        const RunRecord& judged =
            res.directions[i].plan_path.rfind("reference", 0) == 0 ? vr.reference : vr.plans[0].run;
        res.directions[i].run.world_size = judged.world_size, res.directions[i].run.backend = judged.backend;
    }
    const bool pass =
        std::all_of(res.directions.begin(), res.directions.end(), [](auto& d) { return d.pass; });
    res.verdict = pass ? Verdict::pass : Verdict::fail;
    if (res.verdict == Verdict::fail) {
        for (const auto& d : res.directions)
            if (!d.pass)
                res.detail +=
                    fmt::format("{}{}: {}", res.detail.empty() ? "" : "; ", d.plan_path, worst(d, 3));
        if (!res.directions[0].localisation.empty()) res.detail += "; " + res.directions[0].localisation;
        for (const std::string& n : res.directions[0].notes)
            if (n.rfind("cause: ", 0) == 0) res.causes.push_back(n);
    }
    if (res.verdict == Verdict::fail && opt.update &&
        !res.directions[1].pass) {  // the numbers moved: re-record, loudly
        TensorFile fresh = record_golden(job.inputs, plan, job.options);
        if (c.compact_sample) fresh = compact_golden(fresh, c.compact_sample);
        // the case's texts and provenance kept, the dtype and rule this record was made with its own
        std::map<std::string, std::string> own = std::move(fresh.metadata);
        fresh.metadata = c.file.metadata;
        for (const char* key : {"dtype", "rtol", "atol", "rel_fro", "master_rtol", "master_atol"})
            if (auto it = own.find(key); it != own.end())
                fresh.metadata[key] = it->second;
            else
                fresh.metadata.erase(key);
        release_input(c.path);  // replayed from it, rewritten on purpose
        write_safetensors(c.path, fresh, true);
        res.detail = fmt::format("updated: moved: {}", worst(res.directions[1], 5));
        res.verdict = Verdict::updated;
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

namespace {

// One golden file replayed (InputError: the file, its model or plan, or the run as asked refused).
CaseResult replay_file(const std::string& path, const ReplayOptions& opt, Device device,
                       const std::string& dtype, Launch& launch) {
    const GoldenCase c = load_golden(path);
    if (!c.stale.empty()) return {path, Verdict::stale, c.stale, {}, {}, 1, 0.0};  // reported, not built from
    RunInputs in;
    in.model_path = c.path + "[model_yaml]";
    in.model_text = c.model_yaml;
    in.dtype_override = dtype.empty() ? c.dtype : dtype;  // the golden's own, unless told otherwise
    in.device = device;
    load_model_text(in.model_text, in.model_path, in.dtype_override, false);  // a model that no longer parses
    const Plan plan = load_plan_text(c.plan_yaml, c.path + "[plan_yaml]");
    return replay_case(c, in, plan, opt, launch);
}

}  // namespace

std::vector<CaseResult> replay_golden_files(const std::vector<std::string>& args, const ReplayOptions& opt,
                                            Device device, const std::string& dtype,
                                            const std::function<void(const CaseResult&)>& on_case) {
    std::vector<CaseResult> results;
    const auto launch = in_process_launch(device, opt.verify.comm);
    for (const std::string& path : golden_paths(args)) {
        try {
            results.push_back(replay_file(path, opt, device, dtype, *launch));
        } catch (const InputError& e) {  // this case refused; the others still run (the command: exit 2)
            results.push_back({path, Verdict::refused, e.what(), {}, {}, 1, 0.0});
        }
        if (on_case) on_case(results.back());
    }
    return results;
}

}  // namespace ptool
