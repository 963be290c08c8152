#include "verify/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "model/batch.h"
#include "parallel/plan.h"

namespace ptool {
namespace {

std::string event_label(const ModuleEvent& e) {
    const size_t hash = e.fqn.find('#');  // a module's event from inside it (sub_event): "FQN#PART"
    const std::string fqn = e.fqn.substr(0, hash), name = fqn.empty() ? "(root)" : fqn;
    const std::string part = hash != std::string::npos   ? e.fqn.substr(hash + 1)
                             : e.phase == Phase::forward ? "output"
                                                         : "input gradient";
    return fmt::format("{} `{}` {}", phase_name(e.phase), name, part);
}

// Replica invariants (test_jit_data_parallel, test_replicate's state_dict tests): after the
// parallel model is built (shards, broadcasts), its state_dict has the reference's names and,
// gathered, bitwise the reference's values; shared modules are still one module (as many
// unique parameters). A failure counts as one failed check.
void check_init_state(const RunRecord& ref, const RunRecord& par, PlanReport& rep) {
    if (ref.init_state.empty() || par.init_state.empty()) return;
    std::vector<std::string> renamed, differ;
    for (size_t i = 0; i < std::max(ref.init_state.size(), par.init_state.size()); ++i) {
        if (i >= ref.init_state.size() || i >= par.init_state.size() ||
            ref.init_state[i].first != par.init_state[i].first) {
            renamed.push_back(i < par.init_state.size() ? par.init_state[i].first : ref.init_state[i].first);
            continue;
        }
        if (par.init_state[i].second != ref.init_state[i].second) differ.push_back(ref.init_state[i].first);
    }
    const bool shared_ok = ref.unique_params == par.unique_params;
    const auto& split = par.init_replicas_differ;
    if (renamed.empty() && differ.empty() && shared_ok && split.empty()) {
        rep.notes.push_back(
            fmt::format("state_dict after construction: {} keys, the reference's names, bitwise its "
                        "values; {} unique parameters",
                        ref.init_state.size(), par.unique_params));
        return;
    }
    rep.failed += 1;
    if (!renamed.empty())
        rep.notes.push_back(
            fmt::format("FAIL state_dict keys differ from the reference's: {}", fmt::join(renamed, ", ")));
    if (!differ.empty())
        rep.notes.push_back(
            fmt::format("FAIL after construction, {} of {} tensors differ from the reference's (a broadcast "
                        "missed or sent from the wrong rank?): {}",
                        differ.size(), ref.init_state.size(), fmt::join(differ, ", ")));
    if (!split.empty())
        rep.notes.push_back(
            fmt::format("FAIL after construction, the replicas of {} differ across ranks (a broadcast "
                        "missed?): {}",
                        split.size() == 1 ? "one tensor" : fmt::format("{} tensors", split.size()),
                        fmt::join(split, ", ")));
    if (!shared_ok)
        rep.notes.push_back(
            fmt::format("FAIL {} unique parameters, the reference has {}: a shared module was copied",
                        par.unique_params, ref.unique_params));
}

// The norms a module rule judges a gradient or parameter against: its module's gradients' (the
// tensors whose names differ only in their last atom) and its block's rounding floor (`systematic`
// of the enclosing block's norm; the step's whole gradient for a top-level module).
struct ModuleScale {
    double module = 0, floor = 0;
};

std::map<std::string, ModuleScale> module_scales(const PlanReport& rep, const Tolerance& tol) {
    auto group_of = [&](const std::string& name) {
        const auto k = parse_step_key(name);
        // mixed precision's masters are full precision: their rule is elementwise (and the update rule)
        if (!k || (k->kind() != "grad" && (k->kind() != "param" || tol.masters))) return std::string();
        return name.substr(0, name.rfind('.'));
    };
    auto parent_of = [](const std::string& g) { return g.substr(0, g.rfind('.')); };
    std::map<std::string, double> ref2, parent2;
    for (const TensorReport& t : rep.tensors)
        if (const std::string g = group_of(t.name); !g.empty()) {
            const double r2 = t.diff.ref_norm * t.diff.ref_norm;
            ref2[g] += r2;
            for (std::string p = parent_of(g);; p = parent_of(p)) {  // every enclosing block
                parent2[p] += r2;
                if (p.find('.') == p.rfind('.')) break;  // "step0.grad": the step's whole gradient
            }
        }
    std::map<std::string, ModuleScale> out;
    for (const TensorReport& t : rep.tensors)
        if (const std::string g = group_of(t.name); !g.empty())
            out[t.name] = {std::sqrt(ref2[g]), tol.systematic * std::sqrt(parent2[parent_of(g)])};
    return out;
}

// The norm the systematic rule judges a gradient's error against. A module's gradient at its
// block's rounding level (under `systematic` of the block's norm: the true gradient vanishes, as
// q/k's where every key is alike, and what was computed is the block's rounding residue) has no
// digits two summation orders share: its error is judged against that floor, so an error of the
// block's scale still fails. A gradient above its module's rounding level (its norm over
// `systematic` of the module's: a true gradient, however small beside the module's other tensors,
// as a bias's beside its weight's) is judged against its own norm: its rounding scales with it
// (measured, docs/architecture.md), and a 0.1% error in it is far below its module's scale.
double judged_norm(double own, const ModuleScale& s, double systematic) {
    return s.module >= s.floor && own > systematic * s.module ? own : std::max(s.module, s.floor);
}

// Under clip_grad_norm, where the two runs' norms part, each run scales every gradient by its own
// norm's coefficient, min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ does, so
// that every gradient whose own computation agreed parts from the reference's by one factor: the
// ratio of the two coefficients, known exactly from the two recorded norms (the grad_norm is
// compared with signed_sum: Tolerance::clip_max_norm). The step's first gradient that parts by more
// than rounding past that factor is named, or none where that is the first gradient that fails (the
// order's own answer: localise names it as any other). A median of the gradients' own factors
// (TensorDiff::projection) would be the faulty gradients' factor where they are the most.
struct PastFactor {
    const TensorReport* t;
    double factor, left;  // the shared factor less 1; what is left of its error, of its norm
};
std::optional<PastFactor> past_clip_factor(const PlanReport& rep, const Tolerance& tol, int64_t step) {
    const double bound = tol.systematic > 0 ? tol.systematic : tol.rel_fro;  // rounding's reach
    if (tol.clip_max_norm <= 0 || bound <= 0) return std::nullopt;
    const TensorReport* norm = nullptr;
    std::vector<const TensorReport*> grads;
    for (const TensorReport& t : rep.tensors)
        if (const auto k = parse_step_key(t.name); k && k->step == step) {
            if (k->kind() == "grad_norm") norm = &t;
            if (k->kind() == "grad") grads.push_back(&t);
        }
    if (!norm || norm->pass || norm->diff.nonfinite || !norm->diff.shape_ok)
        return std::nullopt;  // one factor: the norms agree
    const double expected = norm->diff.ref_norm, actual = expected + norm->diff.signed_err;  // norms >= 0
    auto coefficient = [&](double n) { return std::min(1.0, tol.clip_max_norm / (n + 1e-6)); };
    const double m = coefficient(actual) / coefficient(expected) - 1;
    if (!std::isfinite(m) || m == 0) return std::nullopt;
    const std::map<std::string, ModuleScale> scales = module_scales(rep, tol);
    bool first = true;  // the first gradient that fails
    for (const TensorReport* t : grads) {
        if (!t->diff.projected || !t->diff.shape_ok || t->diff.nonfinite) return std::nullopt;
        const auto it = scales.find(t->name);
        if (t->pass || it == scales.end()) continue;
        // ||a - (1 + m) e||^2 = ||a - e||^2 - 2 m <a - e, e> + m^2 ||e||^2
        const double e2 = t->diff.ref_norm * t->diff.ref_norm,
                     left = std::sqrt(std::max(0.0, t->diff.err_norm * t->diff.err_norm -
                                                        2 * m * t->diff.projection * e2 + m * m * e2));
        if (left > bound * judged_norm(t->diff.ref_norm, it->second, bound)) {
            if (first) return std::nullopt;
            return PastFactor{
                t, m,
                t->diff.ref_norm > 0 ? left / t->diff.ref_norm : std::numeric_limits<double>::infinity()};
        }
        first = false;
    }
    return std::nullopt;
}

}  // namespace

void judge_by_module(PlanReport& rep, const Tolerance& tol) {
    if (tol.rel_fro <= 0 && tol.systematic <= 0) return;
    const std::map<std::string, ModuleScale> scales = module_scales(rep, tol);
    for (TensorReport& t : rep.tensors) {
        const auto it = scales.find(t.name);
        if (it == scales.end() || !t.diff.shape_ok || std::isinf(t.diff.err_norm) ||
            replica_failure(t.replicas))
            continue;
        const double module_norm = it->second.module, own = t.diff.ref_norm,
                     scale = judged_norm(own, it->second, tol.systematic);
        if (!t.pass && tol.rel_fro > 0 && module_norm > 0 && t.diff.err_norm <= tol.rel_fro * module_norm) {
            t.diff.rel_fro = t.diff.err_norm / module_norm;
            t.diff.by_frobenius = t.diff.pass = t.pass = true;
            rep.failed -= 1, rep.passed += 1;
        } else if (t.pass && tol.systematic > 0 && parse_step_key(t.name)->kind() == "grad" &&
                   t.diff.err_norm > tol.systematic * scale && t.replicas != ReplicaState::ignored) {
            t.diff.systematic_own = scale == own && own < module_norm;
            const double of = t.diff.systematic_own ? own : module_norm;
            t.diff.rel_fro = of > 0 ? t.diff.err_norm / of : std::numeric_limits<double>::infinity();
            t.diff.systematic = true, t.diff.pass = t.pass = false;
            rep.failed += 1, rep.passed -= 1;
        }
    }
}

void apply_update_rule(PlanReport& rep, const std::function<bool(const std::string&)>& consistent) {
    std::map<std::string, int64_t> first_bad_grad;  // parameter -> the first step its gradient failed
    for (const TensorReport& t : rep.tensors)
        if (auto k = parse_step_key(t.name); k && k->kind() == "grad" && !t.pass) {
            const std::string param = k->rest.substr(5);
            if (!first_bad_grad.count(param)) first_bad_grad[param] = k->step;
        }
    for (TensorReport& t : rep.tensors) {
        const auto k = parse_step_key(t.name);
        if (t.pass || !k || k->kind() != "param" || !t.diff.shape_ok || t.diff.nonfinite ||
            replica_failure(t.replicas))
            continue;
        const std::string param = k->rest.substr(6);
        if (auto it = first_bad_grad.find(param); it != first_bad_grad.end() && it->second <= k->step)
            continue;
        if (!consistent(t.name)) continue;
        t.diff.by_gradients = t.diff.pass = t.pass = true;
        rep.failed -= 1, rep.passed += 1;
    }
}

void fail_nonfinite(PlanReport& rep, const std::string& actual_side, const std::string& expected_side) {
    const TensorReport* first = nullptr;
    int count = 0;
    for (TensorReport& t : rep.tensors) {
        if (t.diff.nonfinite == 0) continue;
        if (!first) first = &t;
        ++count;
        if (t.pass) t.pass = t.diff.pass = false, rep.passed -= 1, rep.failed += 1;
    }
    if (!first) return;
    const TensorDiff& d = first->diff;
    rep.notes.push_back(fmt::format(
        "FAIL non-finite values (NaN or inf) in {} tensor{}, first {} in {}: a run that is not finite "
        "agrees with nothing (a norm's eps <= 0, a learning rate that diverges?)",
        count, count == 1 ? "" : "s", first->name, nonfinite_sides(d, actual_side, expected_side)));
}

std::string nonfinite_sides(const TensorDiff& d, const std::string& actual_side,
                            const std::string& expected_side) {
    if (d.nonfinite_actual && d.nonfinite_expected)
        return fmt::format("{} ({} element{}) and {} ({})", expected_side, d.nonfinite_expected,
                           d.nonfinite_expected == 1 ? "" : "s", actual_side, d.nonfinite_actual);
    const bool expected = d.nonfinite_expected > 0;
    const int64_t n = expected ? d.nonfinite_expected : d.nonfinite_actual;
    return fmt::format("{} ({} element{})", expected ? expected_side : actual_side, n, n == 1 ? "" : "s");
}

const char* verdict_name(Verdict v) {
    switch (v) {
        case Verdict::pass:
            return "PASS";
        case Verdict::fail:
            return "FAIL";
        case Verdict::stale:
            return "STALE";
        case Verdict::updated:
            return "UPDATED";
        case Verdict::refused:
            return "REFUSED";
    }
    return "?";
}

const char* replica_state_name(ReplicaState s) {
    switch (s) {
        case ReplicaState::equal:
            return "equal";
        case ReplicaState::sharded:
            return "-";
        case ReplicaState::differ:
            return "DIFFER";
        case ReplicaState::ignored:
            return "ignored";
        case ReplicaState::synced:
            return "SYNCED";
    }
    return "?";
}

std::string event_key(const ModuleEvent& e) {
    return fmt::format("{}:{}:{}:{}", e.microbatch, static_cast<int>(e.phase), e.call, e.fqn);
}

const Tensor* find_tensor(const StepRecord& step, const std::string& name) {
    for (const auto& [n, t] : step.tensors)
        if (n == name) return &t;
    return nullptr;
}

std::optional<Divergence> localise(const RunRecord& ref, const RunRecord& par, const Tolerance& tol,
                                   const PlanReport& rep) {
    double prev_rel = 0, prev_abs = 0;
    // how close what agreed before was: its max rel, or its max abs where the rel is not finite (a
    // reference of zeros the other side met within the absolute tolerance)
    auto agreed = [&] {
        return std::isfinite(prev_rel) ? fmt::format("max rel {:.2g}", prev_rel)
                                       : fmt::format("max abs {:.2g}", prev_abs);
    };
    std::string prev = "the step's input";
    auto diverged = [&](int64_t step, const std::string& kind, const std::string& fqn,
                        const std::string& what, const TensorDiff& d) {
        if (d.nonfinite)  // the first NaN or inf, on either side: nothing after it means anything
            return Divergence{
                step,
                kind,
                fqn,
                d,
                prev,
                fmt::format("first non-finite value: step {} {} holds NaN or inf in {}; before it, {} agreed "
                            "and was finite",
                            step, what, nonfinite_sides(d, "the parallel run", "the reference"), prev)};
        const std::string how = d.systematic ? fmt::format("error {:.2g} of its {}norm, beyond rounding",
                                                           d.rel_fro, d.systematic_own ? "" : "module's ")
                                             : fmt::format("max rel {:.2g}", d.max_rel);
        return Divergence{
            step,
            kind,
            fqn,
            d,
            prev,
            fmt::format("first divergence: step {} {}, {} (max abs {:.3g}); before it, {} agreed ({})", step,
                        what, how, d.max_abs, prev, agreed())};
    };
    for (size_t s = 0; s < ref.steps.size() && s < par.steps.size(); ++s) {
        // the reference's events in the order it computed them, each met by key in the parallel
        // run's: an event the parallel run does not report (another stage's, not compared) is
        // passed over; one reported without a comparison ends the walk (nothing after it is known)
        std::map<std::string, const ModuleEvent*> by_key;
        for (const ModuleEvent& e : par.steps[s].events) by_key.emplace(event_key(e), &e);
        for (const ModuleEvent& re : ref.steps[s].events) {
            const auto it = by_key.find(event_key(re));
            if (it == by_key.end()) continue;
            const ModuleEvent& pe = *it->second;
            if (!pe.diff && !pe.full.defined()) break;
            const TensorDiff d = pe.diff ? *pe.diff : compare_tensors(pe.full, re.full, tol);
            if (!d.pass || d.nonfinite)
                return diverged(static_cast<int64_t>(s), phase_name(re.phase), re.fqn, event_label(re), d);
            prev_rel = d.max_rel, prev_abs = d.max_abs;
            prev = event_label(re);
        }
        // after the backward: the parameters' gradients, their norm (clip_grad_norm), then the
        // optimizer's updates. A gradient whose copies differed before the clip comes first: the
        // clip scales each group of copies by its own norm, so every gradient after it differs.
        const auto& states = par.steps[s].replicas;
        for (const TensorReport& t : rep.tensors) {
            const auto k = parse_step_key(t.name);
            if (!k || k->step != static_cast<int64_t>(s) || k->kind() != "grad") continue;
            const std::string fqn = k->rest.substr(5);
            if (!states.count(fmt::format("step{}.{}{}", s, kGradBeforeClip, fqn))) continue;
            Divergence d =
                diverged(static_cast<int64_t>(s), "grad", fqn, fmt::format("gradient of `{}`", fqn), t.diff);
            if (t.diff.nonfinite) return d;  // a NaN or inf says more than the copies do
            d.text = fmt::format(
                "first divergence: step {} gradient of `{}`: its copies differ across replicas before "
                "clip_grad_norm (which scales each group of copies by its own norm, so that every gradient "
                "differs after it); before it, {} agreed ({})",
                s, fqn, prev, agreed());
            return d;
        }
        if (const auto past = past_clip_factor(rep, tol, static_cast<int64_t>(s))) {
            const std::string fqn = parse_step_key(past->t->name)->rest.substr(5);
            Divergence d = diverged(static_cast<int64_t>(s), "grad", fqn,
                                    fmt::format("gradient of `{}`", fqn), past->t->diff);
            d.text = fmt::format(
                "first divergence: step {} gradient of `{}`: past the factor {:.6g} by which clip_grad_norm "
                "scales every gradient apart from the reference's (their norms part), it parts by {:.2g} of "
                "its norm (max abs {:.3g}); before it, {} agreed ({})",
                s, fqn, 1 + past->factor, past->left, past->t->diff.max_abs, prev, agreed());
            return d;
        }
        for (const std::string kind : {"grad", "grad_norm", "param"})
            for (const TensorReport& t : rep.tensors) {
                const auto k = parse_step_key(t.name);
                if (!k || k->step != static_cast<int64_t>(s) || k->kind() != kind) continue;
                const std::string fqn = kind == "grad_norm" ? std::string() : k->rest.substr(kind.size() + 1);
                const std::string what =
                    kind == "grad_norm"
                        ? std::string("gradient norm (clip_grad_norm's, before clipping)")
                        : fmt::format("{} of `{}`", kind == "grad" ? "gradient" : "update", fqn);
                if (!t.pass) return diverged(static_cast<int64_t>(s), kind, fqn, what, t.diff);
                prev_rel = t.diff.max_rel, prev_abs = t.diff.max_abs;
                prev = what;
            }
    }
    return std::nullopt;
}

std::vector<ErrorCell> error_cells(const PlanReport& rep) {
    std::vector<ErrorCell> cells;
    std::map<int64_t, std::vector<const TensorReport*>> by_step;
    for (const TensorReport& t : rep.tensors)
        if (const auto k = parse_step_key(t.name)) by_step[k->step].push_back(&t);
    const int64_t steps = std::max<int64_t>(static_cast<int64_t>(rep.run.steps.size()),
                                            by_step.empty() ? 0 : by_step.rbegin()->first + 1);
    for (int64_t s = 0; s < steps; ++s) {
        if (s < static_cast<int64_t>(rep.run.steps.size()))
            for (const ModuleEvent& e : rep.run.steps[s].events)
                if (e.diff)
                    cells.push_back(
                        {s, phase_name(e.phase), e.fqn, "", *e.diff, e.diff->pass && !e.diff->nonfinite});
        for (const TensorReport* t : by_step[s]) {
            const auto k = parse_step_key(t->name);
            const std::string kind = k->kind();
            std::string owner;
            if (k->rest.size() > kind.size()) {
                const std::string fqn = k->rest.substr(kind.size() + 1);
                const size_t dot = fqn.rfind('.');
                owner = dot == std::string::npos ? "" : fqn.substr(0, dot);
            }
            cells.push_back({s, kind, owner, t->name, t->diff, t->pass});
        }
    }
    return cells;
}

void judge_loss_by_outputs(PlanReport& rep, const Tolerance& tol,
                           const std::function<const Tensor*(const std::string&)>& expected) {
    if (tol.loss_of_outputs == Tolerance::OutputSum::none) return;
    std::map<std::string, const TensorReport*> rows;
    for (const TensorReport& t : rep.tensors) rows[t.name] = &t;
    for (TensorReport& t : rep.tensors) {
        const auto k = parse_step_key(t.name);
        if (t.pass || !k || k->kind() != "loss" || !t.diff.shape_ok || t.diff.nonfinite ||
            replica_failure(t.replicas))
            continue;
        const std::string output = fmt::format("step{}.output", k->step);
        auto o = rows.find(output);
        const Tensor* e = expected(t.name);
        if (o == rows.end() || !o->second->pass || !o->second->diff.shape_ok || o->second->diff.nonfinite ||
            o->second->diff.elements == 0 || !e || !e->defined() || e->numel() != 1)
            continue;
        // the loss its outputs' difference makes, and the outputs' magnitude
        double d = std::abs(o->second->diff.signed_err), m = o->second->diff.expected_l1;
        if (tol.loss_of_outputs == Tolerance::OutputSum::mean) {
            const auto n = static_cast<double>(o->second->diff.elements);
            d /= n, m /= n;
        }
        const double bound = tol.atol + tol.rtol * std::abs(e->item(0)) + d + tol.output_eps * m;
        if (!(t.diff.max_abs <= bound)) continue;
        t.diff.pass = t.pass = true;
        t.diff.headroom = bound > 0 ? t.diff.max_abs / bound : 0.0;
        rep.failed -= 1, rep.passed += 1;
    }
}

PlanReport compare_runs(const RunRecord& reference, const RunRecord& parallel, const Plan& plan,
                        const Tolerance& tol) {
    PlanReport rep;
    rep.plan_path = plan.path;
    rep.tol = tol;
    for (size_t s = 0; s < reference.steps.size() && s < parallel.steps.size(); ++s) {
        const StepRecord &r = reference.steps[s], &p = parallel.steps[s];
        for (const auto& [name, expected] : r.tensors) {
            const std::string kind = parse_step_key(name)->kind();  // names the recorder made
            if (!plan.compares(kind == "grad_norm" ? "grad" : kind) && kind != "buffer") continue;
            TensorReport tr;
            tr.name = name;
            if (const Tensor* actual = find_tensor(p, name))
                tr.diff = compare_tensors(*actual, expected, rule_for(tol, name));
            else if (auto d = p.vs_reference.find(name); d != p.vs_reference.end())
                tr.diff = d->second;  // compared as recorded
            else
                tr.diff.shape_ok = tr.diff.pass = false;  // missing
            tr.pass = tr.diff.pass;
            auto status = p.replicas.find(name);
            tr.replicas = status == p.replicas.end() ? ReplicaState::sharded : status->second;
            if (replica_failure(tr.replicas)) tr.pass = false;
            if (tr.replicas == ReplicaState::ignored)
                tr.pass = true;  // an ignored module's tensors differ by design
            (tr.pass ? rep.passed : rep.failed) += 1;
            rep.tensors.push_back(std::move(tr));
        }
    }
    judge_by_module(rep, tol);
    judge_loss_by_outputs(rep, tol, [&](const std::string& n) -> const Tensor* {
        const auto k = parse_step_key(n);
        const size_t s = k ? static_cast<size_t>(k->step) : reference.steps.size();
        return s < reference.steps.size() ? find_tensor(reference.steps[s], n) : nullptr;
    });
    apply_update_rule(
        rep, [&](const std::string& name) {  // the parallel run's update is its optimizer's on its gradients
            const auto k = parse_step_key(name);
            if (k->step >= static_cast<int64_t>(parallel.steps.size())) return false;
            const auto& shadow = parallel.steps[k->step].vs_shadow;
            auto it = shadow.find(name);
            return it != shadow.end() && it->second.pass;
        });
    fail_nonfinite(rep, "the parallel run", "the reference");
    check_init_state(reference, parallel, rep);
    rep.pass = rep.failed == 0;
    if (!rep.pass) {
        rep.divergence = localise(reference, parallel, tol, rep);
        if (rep.divergence) rep.localisation = rep.divergence->text;
    }
    return rep;
}

}  // namespace ptool
