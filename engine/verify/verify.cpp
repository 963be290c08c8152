#include "verify/verify.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "comm/comm_choice.h"
#include "comm/comm_threads.h"
#include "model/batch.h"
#include "model/model.h"
#include "parallel/parallelize.h"

namespace ptool {
namespace {

std::string event_label(const ModuleEvent& e) {
    const std::string name = e.fqn.empty() ? "(root)" : e.fqn;
    return e.phase == "forward" ? fmt::format("forward `{}` output", name) : fmt::format("backward `{}` input gradient", name);
}

// The first module, in the order things were computed (forward, then backward), whose output or
// input gradient leaves tolerance while what was computed just before it still agreed.
std::string localise(const RunRecord& ref, const RunRecord& par, const Tolerance& tol) {
    for (size_t s = 0; s < ref.steps.size() && s < par.steps.size(); ++s) {
        const auto &re = ref.steps[s].events, &pe = par.steps[s].events;
        if (re.size() != pe.size() || re.empty()) continue;
        double prev_rel = 0;
        std::string prev = "the step's input";
        for (size_t i = 0; i < re.size(); ++i) {
            if (re[i].fqn != pe[i].fqn || re[i].phase != pe[i].phase) break;
            if (!pe[i].diff && !pe[i].full.defined()) break;
            const TensorDiff d = pe[i].diff ? *pe[i].diff : compare_tensors(pe[i].full, re[i].full, tol);
            if (!d.pass)
                return fmt::format("first divergence: step {} {}, max rel {:.2g} (max abs {:.3g}); before it, {} agreed (max rel {:.2g})",
                                   s, event_label(re[i]), d.max_rel, d.max_abs, prev, prev_rel);
            prev_rel = d.max_rel;
            prev = event_label(re[i]);
        }
    }
    return "";
}

// Replica invariants (test_jit_data_parallel, test_replicate's state_dict tests): after the
// parallel model is built (shards, broadcasts), its state_dict has the reference's names and,
// gathered, bitwise the reference's values; shared modules are still one module (as many
// unique parameters). A failure counts as one failed check.
void check_init_state(const RunRecord& ref, const RunRecord& par, PlanReport& rep) {
    if (ref.init_state.empty() || par.init_state.empty()) return;
    std::vector<std::string> renamed, differ;
    for (size_t i = 0; i < std::max(ref.init_state.size(), par.init_state.size()); ++i) {
        if (i >= ref.init_state.size() || i >= par.init_state.size() || ref.init_state[i].first != par.init_state[i].first) {
            renamed.push_back(i < par.init_state.size() ? par.init_state[i].first : ref.init_state[i].first);
            continue;
        }
        if (par.init_state[i].second != ref.init_state[i].second) differ.push_back(ref.init_state[i].first);
    }
    const bool shared_ok = ref.unique_params == par.unique_params;
    const auto& split = par.init_replicas_differ;
    if (renamed.empty() && differ.empty() && shared_ok && split.empty()) {
        rep.notes.push_back(fmt::format("state_dict after construction: {} keys, the reference's names, bitwise its "
                                        "values; {} unique parameters",
                                        ref.init_state.size(), par.unique_params));
        return;
    }
    rep.failed += 1;
    if (!renamed.empty())
        rep.notes.push_back(fmt::format("FAIL state_dict keys differ from the reference's: {}", fmt::join(renamed, ", ")));
    if (!differ.empty())
        rep.notes.push_back(fmt::format("FAIL after construction, {} of {} tensors differ from the reference's (a broadcast "
                                        "missed or sent from the wrong rank?): {}",
                                        differ.size(), ref.init_state.size(), fmt::join(differ, ", ")));
    if (!split.empty())
        rep.notes.push_back(fmt::format("FAIL after construction, the replicas of {} differ across ranks (a broadcast "
                                        "missed?): {}",
                                        split.size() == 1 ? "one tensor" : fmt::format("{} tensors", split.size()),
                                        fmt::join(split, ", ")));
    if (!shared_ok)
        rep.notes.push_back(fmt::format("FAIL {} unique parameters, the reference has {}: a shared module was copied",
                                        par.unique_params, ref.unique_params));
}

// Compares one plan's run with the reference and adds it to the report.
void add_plan(VerifyReport& report, RunRecord reference, RunRecord parallel, const Plan& plan, const Resolution& res,
              const Tolerance& tol) {
    PlanReport rep = compare_runs(reference, parallel, plan, tol);
    rep.warnings = res.warnings;
    if (!rep.pass)
        for (const std::string& c : res.causes) rep.notes.push_back("cause: " + c);
    rep.run = std::move(parallel);
    report.pass = report.pass && rep.pass;
    report.plans.push_back(std::move(rep));
    report.reference = std::move(reference);
}

}  // namespace

int64_t steps_for(const VerifyInputs& in, const Plan& plan, const VerifyOptions& opt, int64_t model_steps) {
    if (opt.steps > 0) return opt.steps;
    if (plan.verify.steps > 0) return plan.verify.steps;
    return model_steps;
}

Tolerance tolerance_for(const Plan& plan, const VerifyOptions& opt, const Model& model) {
    int depth = 0;  // leaf modules: no tensor is further than that from the output
    for_each_module(*model.root, [&](const std::string&, Module& m) { depth += m.children().empty(); });
    Tolerance t = default_tolerance(model.dtype, depth);
    if (plan.verify.rtol || plan.verify.atol || opt.rtol || opt.atol) t.rel_fro = 0;  // a tolerance asked for is the rule
    if (plan.verify.rtol) t.rtol = *plan.verify.rtol;
    if (plan.verify.atol) t.atol = *plan.verify.atol;
    if (opt.rtol) t.rtol = *opt.rtol;
    if (opt.atol) t.atol = *opt.atol;
    return t;
}

// Low precision (compare.h): a grad or param that fails alone is measured against its module's
// (the same step's tensors of that kind whose names differ only in the last atom, flattened).
void judge_by_module(PlanReport& rep, const Tolerance& tol) {
    auto group_of = [](const std::string& name) {
        const auto k = parse_step_key(name);
        if (!k || (k->kind() != "grad" && k->kind() != "param")) return std::string();
        return name.substr(0, name.rfind('.'));
    };
    std::map<std::string, double> ref2;
    for (const TensorReport& t : rep.tensors)
        if (const std::string g = group_of(t.name); !g.empty()) ref2[g] += t.diff.ref_norm * t.diff.ref_norm;
    for (TensorReport& t : rep.tensors) {
        const std::string g = group_of(t.name);
        if (t.pass || g.empty() || !t.diff.shape_ok || std::isinf(t.diff.err_norm) || t.replicas == "DIFFER" ||
            t.replicas == "SYNCED")
            continue;
        const double module_norm = std::sqrt(ref2[g]);
        if (module_norm > 0 && t.diff.err_norm <= tol.rel_fro * module_norm) {
            t.diff.rel_fro = t.diff.err_norm / module_norm;
            t.diff.by_frobenius = t.diff.pass = t.pass = true;
            rep.failed -= 1, rep.passed += 1;
        }
    }
}

PlanReport compare_runs(const RunRecord& reference, const RunRecord& parallel, const Plan& plan, const Tolerance& tol) {
    PlanReport rep;
    rep.plan_path = plan.path;
    rep.tol = tol;
    for (size_t s = 0; s < reference.steps.size() && s < parallel.steps.size(); ++s) {
        const StepRecord &r = reference.steps[s], &p = parallel.steps[s];
        for (const auto& [name, expected] : r.tensors) {
            const std::string kind = parse_step_key(name)->kind();  // names this file's runners made
            if (!plan.compares(kind) && kind != "buffer") continue;
            TensorReport tr;
            tr.name = name;
            if (const Tensor* actual = find_tensor(p, name)) tr.diff = compare_tensors(*actual, expected, tol);
            else if (auto d = p.vs_reference.find(name); d != p.vs_reference.end()) tr.diff = d->second;  // compared as recorded
            else tr.diff.shape_ok = tr.diff.pass = false;  // missing
            tr.pass = tr.diff.pass;
            auto status = p.replicas.find(name);
            tr.replicas = status == p.replicas.end() ? "-" : status->second;
            if (tr.replicas == "DIFFER" || tr.replicas == "SYNCED") tr.pass = false;
            if (tr.replicas == "ignored") tr.pass = true;  // an ignored module's tensors differ by design
            (tr.pass ? rep.passed : rep.failed) += 1;
            rep.tensors.push_back(std::move(tr));
        }
    }
    if (tol.rel_fro > 0) judge_by_module(rep, tol);
    check_init_state(reference, parallel, rep);
    rep.pass = rep.failed == 0;
    if (!rep.pass) rep.localisation = localise(reference, parallel, tol);
    return rep;
}

VerifyReport verify_in_process(const VerifyInputs& in, const std::vector<Plan>& plans, const VerifyOptions& opt) {
    VerifyReport report;
    const Model probe = load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    const Fault fault = parse_fault(std::getenv("PTOOL_FAULT"));
    std::map<int64_t, RunRecord> references;  // by step count: one reference serves every plan
    for (const Plan& plan : plans) {
        VerifyInputs job = in;
        job.steps = steps_for(in, plan, opt, probe.steps);
        if (!references.count(job.steps)) {
            references[job.steps] = run_reference_record(job);
            report.reference_seconds += references[job.steps].seconds;
        }
        const Resolution res = resolve_plan(probe, plan);  // lint before anything runs
        for (const auto& w : res.warnings) spdlog::warn("{}", w);
        job.compare_with = &references[job.steps];  // compared as recorded: the run keeps diffs, not tensors
        job.tol = tolerance_for(plan, opt, probe);
        RunRecord par;
        run_ranks(
            plan.world_size(), opt.comm, [&](Communicator& world) { run_parallel_rank(world, job, plan, fault, &par); },
            in.device);
        add_plan(report, references[job.steps], std::move(par), plan, res, job.tol);
    }
    return report;
}

VerifyReport verify_on_world(Communicator& world, const VerifyInputs& in, const std::vector<Plan>& plans,
                             const VerifyOptions& opt) {
    VerifyReport report;
    const Model probe = load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    const Fault fault = parse_fault(std::getenv("PTOOL_FAULT"));
    const bool rank0 = world.rank() == 0;
    std::map<int64_t, RunRecord> references;  // rank 0, by step count: one reference serves every plan
    for (const Plan& plan : plans) {
        if (plan.world_size() != world.size())
            throw InputError(plan.mesh_where, fmt::format("the mesh has {} ranks but mpirun started {}", plan.world_size(),
                                                          world.size()));
        VerifyInputs job = in;
        job.steps = steps_for(in, plan, opt, probe.steps);
        const Resolution res = resolve_plan(probe, plan);
        if (rank0)
            for (const auto& w : res.warnings) spdlog::warn("{}", w);
        // Rank 0 runs the reference first, so that it compares the parallel run's tensors as it
        // gathers them (as in-process); the other ranks wait here, within the collective timeout,
        // as they wait for rank 0's report at the end.
        if (rank0 && !references.count(job.steps)) {
            references[job.steps] = run_reference_record(job);
            report.reference_seconds += references[job.steps].seconds;
        }
        world.barrier();
        if (rank0) job.compare_with = &references[job.steps], job.tol = tolerance_for(plan, opt, probe);
        RunRecord par;
        run_parallel_rank(world, job, plan, fault, &par);
        if (rank0) add_plan(report, references[job.steps], std::move(par), plan, res, job.tol);
    }
    return report;
}

}  // namespace ptool
