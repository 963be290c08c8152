#include "cli/verify_output.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "model/batch.h"

namespace ptool::cli {

std::string format_bytes(int64_t b) {
    if (b < 1024) return fmt::format("{} B", b);
    if (b < (1 << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
    if (b < (1 << 30)) return fmt::format("{:.1f} MiB", b / 1048576.0);
    return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

void print_columns(const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
    std::vector<size_t> width;
    for (const auto& r : rows)
        for (size_t i = 0; i < r.size(); ++i)
            width.resize(std::max(width.size(), r.size())), width[i] = std::max(width[i], r[i].size());
    for (const auto& r : rows) {
        std::string line = indent;
        for (size_t i = 0; i < r.size(); ++i)
            line += i + 1 < r.size() ? fmt::format("{:<{}}  ", r[i], width[i]) : r[i];
        fmt::print("{}\n", line);
    }
}

std::string format_counts(const CommCounter& c, int64_t steps) {
    std::vector<std::string> parts;
    for (const auto& [op, t] : c.by_op()) {
        const int64_t calls = t.calls / std::max<int64_t>(1, steps);
        parts.push_back(fmt::format("{} x{} ({})", collective_name(op), calls,
                                    format_bytes(t.bytes / std::max<int64_t>(1, steps))));
    }
    return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, ", "));
}

static std::string num(double v) {
    if (std::isinf(v)) return "inf";
    return fmt::format("{:.2e}", v);
}

void print_table(const PlanReport& p, int verbosity) {
    auto shown = [&](const TensorReport& t) {
        return !(t.pass && (verbosity < 0 || (verbosity == 0 && p.tensors.size() > 60)));
    };
    size_t w = 44;  // the name column fits the longest name shown (HF's FQNs run past 60)
    for (const TensorReport& t : p.tensors)
        if (shown(t)) w = std::max(w, t.name.size());
    fmt::print("  {:<{}} {:>9} {:>9} {:>6} {:>9} {:>8}  {}\n", "tensor", w, "max abs", "max rel", "ULP",
               "headroom", "replicas", "verdict");
    for (const TensorReport& t : p.tensors) {
        if (!shown(t)) continue;  // -q, large models: failures only
        fmt::print(
            "  {:<{}} {:>9} {:>9} {:>6} {:>9.3f} {:>8}  {}\n", t.name, w, num(t.diff.max_abs),
            num(t.diff.max_rel), t.diff.max_ulp, std::isinf(t.diff.headroom) ? 1e9 : t.diff.headroom,
            replica_state_name(t.replicas),
            !t.diff.shape_ok                      ? "MISSING/SHAPE"
            : t.replicas == ReplicaState::ignored ? "ignored"
            : !t.pass && t.diff.nonfinite ? fmt::format("NON-FINITE ({} NaN or inf)", t.diff.nonfinite)
            : !t.pass && t.diff.systematic
                ? fmt::format("MISMATCH (error {:.1e} of its {}norm: beyond rounding)", t.diff.rel_fro,
                              t.diff.systematic_own ? "" : "module's ")
            : !t.pass             ? "MISMATCH"
            : t.diff.by_frobenius ? fmt::format("ok (rel Frobenius {:.1e})", t.diff.rel_fro)
            : t.diff.by_gradients
                ? std::string(p.tol.masters ? "ok (gradients agree; the update is the optimizer's on them)"
                                            : "ok (gradients agree; AdamW's update amplifies their rounding)")
                : "ok");
    }
}

void print_report(const VerifyReport& report, const std::string& model_path, int verbosity) {
    for (const PlanReport& p : report.plans) {
        const int64_t steps = p.run.steps.empty() ? 1 : static_cast<int64_t>(p.run.steps.size());
        fmt::print(
            "ptool verify {} {}: {} ranks ({}), {} step{}, {} rtol {:g} atol {:g}{}{}\n", model_path,
            p.plan_path, p.run.world_size, p.run.backend, steps, steps == 1 ? "" : "s",
            p.tol.masters ? "mixed precision: computed tensors" : dtype_name(report.dtype), p.tol.rtol,
            p.tol.atol,
            p.tol.rel_fro > 0 ? fmt::format(", or relative Frobenius error <= {:.2g}", p.tol.rel_fro) : "",
            p.tol.masters ? fmt::format("; {} master parameters rtol {:g} atol {:g}",
                                        dtype_name(report.dtype), p.tol.masters->rtol, p.tol.masters->atol)
                          : "");
        if (verbosity >= 0 || !p.pass) print_table(p, verbosity);  // -q: the failing tensors only
        for (const std::string& n : p.notes) fmt::print("  {}\n", n);
        if (p.run.dp_buckets) {
            const int64_t ar = p.run.bucket_allreduce_bytes;
            fmt::print(
                "  data parallel: {} bucket{}, gradient all_reduce {} per step for {} of gradients, bucket "
                "copies {} per step\n",
                p.run.dp_buckets, p.run.dp_buckets == 1 ? "" : "s", format_bytes(ar),
                format_bytes(p.run.grad_bytes), format_bytes(p.run.bucket_copy_bytes));
        }
        if (!p.localisation.empty()) fmt::print("  {}\n", p.localisation);
        fmt::print(
            "{}: {} {}/{} tensors agree · reference {:.2f} ms, parallel {:.2f} ms · collectives per step: {}",
            p.plan_path, p.pass ? "PASS" : "FAIL", p.passed, p.passed + p.failed,
            report.reference_seconds * 1e3, p.run.seconds * 1e3, format_counts(p.run.step_counts, steps));
        if (p.run.init_counts.total().calls)
            fmt::print("; at start: {}", format_counts(p.run.init_counts, 1));
        fmt::print("\n");
    }
    if (report.plans.size() > 1) {
        size_t w = 40;
        for (const PlanReport& p : report.plans) w = std::max(w, p.plan_path.size());
        fmt::print("\n  {:<{}} {:>6} {:>7} {:>7}  {}\n", "plan", w, "ranks", "agree", "differ", "verdict");
        for (const PlanReport& p : report.plans)
            fmt::print("  {:<{}} {:>6} {:>7} {:>7}  {}\n", p.plan_path, w, p.run.world_size, p.passed,
                       p.failed, p.pass ? "PASS" : "FAIL");
    }
}

nlohmann::json memory_json(const RankMemory& m, const char* peak_key) {
    nlohmann::json by_use;
    for (int u = 0; u < kMemoryUses; ++u)
        if (m.at_peak[u] != 0) by_use[memory_use_name(static_cast<MemoryUse>(u))] = m.at_peak[u];
    return {{"rank", m.rank}, {peak_key, m.peak}, {"resident_bytes", m.resident}, {"at_peak", by_use}};
}

std::string markup_number(double v) {
    return std::isfinite(v) ? fmt::format("{:.3g}", v) : "inf";
}

std::string markup_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        switch (c) {
            case '&':
                o += "&amp;";
                break;
            case '<':
                o += "&lt;";
                break;
            case '>':
                o += "&gt;";
                break;
            case '"':
                o += "&quot;";
                break;
            default:
                o += c;
        }
    }
    return o;
}

nlohmann::json json_document(const char* kind) {
    return {{"schema_version", kJsonSchemaVersion}, {"kind", kind}, {"ptool", PTOOL_VERSION}};
}

nlohmann::json tensor_id(const std::string& golden_name) {
    const auto k = parse_step_key(golden_name);
    if (!k) return {{"kind", golden_name}};
    const std::string kind = k->kind();
    nlohmann::json id = {{"step", k->step}, {"kind", kind}};
    if (k->rest.size() > kind.size()) id["fqn"] = k->rest.substr(kind.size() + 1);
    return id;
}

static nlohmann::json diff_json(const TensorDiff& d) {
    auto finite = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    return {{"max_abs", finite(d.max_abs)},   {"max_rel", finite(d.max_rel)}, {"ulp", d.max_ulp},
            {"headroom", finite(d.headroom)}, {"rel_fro", finite(d.rel_fro)}, {"nonfinite", d.nonfinite}};
}

static nlohmann::json counts_json(const CommCounter& c) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [key, t] : c.entries())
        out.push_back({{"op", collective_name(std::get<0>(key))},
                       {"mesh_dim", std::get<1>(key)},
                       {"module", std::get<2>(key)},
                       {"calls", t.calls},
                       {"bytes", t.bytes}});
    return out;
}

void write_json_report(const VerifyReport& report, const std::string& model_path, const std::string& path) {
    nlohmann::json j = json_document("verify");
    j["model"] = model_path;
    j["pass"] = report.pass;
    j["reference_seconds"] = report.reference_seconds;
    j["plans"] = nlohmann::json::array();
    auto finite = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    for (const PlanReport& p : report.plans) {
        nlohmann::json jp;
        jp["plan"] = p.plan_path;
        jp["pass"] = p.pass;
        jp["world_size"] = p.run.world_size;
        jp["backend"] = p.run.backend;
        jp["seconds"] = p.run.seconds;
        jp["rtol"] = p.tol.rtol;
        jp["atol"] = p.tol.atol;
        jp["rel_fro"] = p.tol.rel_fro;  // 0: the elementwise rule alone
        jp["warnings"] = p.warnings;
        jp["localisation"] = p.localisation;
        if (p.divergence) {
            const Divergence& d = *p.divergence;
            nlohmann::json at = {{"step", d.step}, {"kind", d.kind}};
            if (!d.fqn.empty()) at["fqn"] = d.fqn;
            jp["divergence"] = {
                {"at", at}, {"diff", diff_json(d.diff)}, {"before", d.before}, {"text", d.text}};
        } else {
            jp["divergence"] = nullptr;
        }
        jp["notes"] = p.notes;
        jp["data_parallel"] = {{"buckets", p.run.dp_buckets},
                               {"gradient_bytes", p.run.grad_bytes},
                               {"bucket_copy_bytes", p.run.bucket_copy_bytes}};
        jp["collectives"] = {{"start", counts_json(p.run.init_counts)},
                             {"steps", counts_json(p.run.step_counts)}};
        jp["memory"] =
            nlohmann::json::array();  // per rank: the training steps' tensors (core/memory_account.h)
        for (const RankMemory& m : p.run.memory)
            jp["memory"].push_back(memory_json(m, "measured_peak_bytes"));
        jp["tensors"] = nlohmann::json::array();
        for (const TensorReport& t : p.tensors)
            jp["tensors"].push_back({{"name", t.name},
                                     {"id", tensor_id(t.name)},
                                     {"pass", t.pass},
                                     {"max_abs", finite(t.diff.max_abs)},
                                     {"max_rel", finite(t.diff.max_rel)},
                                     {"ulp", t.diff.max_ulp},
                                     {"headroom", finite(t.diff.headroom)},
                                     {"rel_fro", finite(t.diff.rel_fro)},
                                     {"by_frobenius", t.diff.by_frobenius},
                                     {"by_gradients", t.diff.by_gradients},
                                     {"nonfinite", t.diff.nonfinite},
                                     {"replicas", replica_state_name(t.replicas)}});
        j["plans"].push_back(jp);
    }
    write_file(path, j.dump(2) + "\n", true);
}

void write_cases_json(const std::vector<CaseResult>& cases, const std::string& path) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : cases) {
        nlohmann::json jc{{"file", r.path},
                          {"verdict", verdict_name(r.verdict)},
                          {"detail", r.detail},
                          {"seconds", r.seconds}};
        for (const auto& d : r.directions) {
            nlohmann::json jd{{"pass", d.pass}, {"passed", d.passed}, {"failed", d.failed}};
            for (const auto& t : d.tensors)
                if (!t.pass)
                    jd["failures"].push_back(
                        {{"name", t.name}, {"id", tensor_id(t.name)}, {"max_abs", t.diff.max_abs}});
            jc["directions"][d.plan_path] = jd;
        }
        j.push_back(jc);
    }
    nlohmann::json doc = json_document("golden_cases");
    doc["cases"] = j;
    write_file(path, doc.dump(2) + "\n", true);
}

}  // namespace ptool::cli
