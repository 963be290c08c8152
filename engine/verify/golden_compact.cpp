// Compact goldens: norms, samples and losses instead of full tensors (verify/golden_compact.h).
#include "verify/golden_compact.h"

#include <cmath>

#include "model/batch.h"

namespace ptool {
namespace {

bool whole(const std::string& kind) {
    return kind == "loss" || kind == "grad_norm";
}

double frobenius(const Tensor& t) {
    const Tensor h = (t.device() == Device::cpu ? t : t.to_device(Device::cpu)).to(DType::float64);
    double s = 0;
    for (int64_t i = 0; i < h.numel(); ++i) s += h.data<double>()[i] * h.data<double>()[i];
    return std::sqrt(s);
}

Tensor sample_of(const Tensor& t, int64_t n) {
    const Tensor h = (t.device() == Device::cpu ? t : t.to_device(Device::cpu)).to(DType::float64);
    const std::vector<int64_t> idx = sample_indices(h.numel(), n);
    Tensor s({static_cast<int64_t>(idx.size())}, DType::float64);
    for (size_t j = 0; j < idx.size(); ++j) s.data<double>()[j] = h.data<double>()[idx[j]];
    return s;
}

int64_t sample_size(const TensorFile& g) {
    auto it = g.metadata.find("compact_sample");
    return it == g.metadata.end() ? 0 : std::stoll(it->second);
}

}  // namespace

std::vector<int64_t> sample_indices(int64_t numel, int64_t n) {
    std::vector<int64_t> idx;
    const int64_t m = std::min(numel, n);
    for (int64_t j = 0; j < m; ++j) idx.push_back(static_cast<int64_t>(static_cast<__int128>(j) * numel / m));
    return idx;
}

bool is_compact(const TensorFile& golden) {
    return golden.metadata.count("compact_sample") > 0;
}

TensorFile compact_golden(const TensorFile& full, int64_t sample) {
    TensorFile out;
    out.metadata = full.metadata;
    out.metadata["compact_sample"] = std::to_string(sample);
    for (const auto& [name, t] : full.tensors) {
        const auto k = parse_step_key(name);
        if (!k || k->rest == "input" || k->rest == "target") continue;  // init and data: ptool's seeded own
        if (whole(k->kind())) {
            out.add(name, t);
            continue;
        }
        out.add(name + ".norm", Tensor::scalar(frobenius(t), DType::float64).reshape({1}));
        out.add(name + ".sample", sample_of(t, sample));
    }
    return out;
}

namespace {

// A whole tensor's rule. A loss of the outputs themselves (Tolerance::loss_of_outputs) passes a
// full golden within atol + rtol |e| + |d| + eps m, d its outputs' difference and m their magnitude
// made into the loss (judge_loss_by_outputs); here only the expected outputs' norm is at hand, so
// d + eps m is allowed what outputs that each pass elementwise can make of it: for a mean, atol +
// (rtol + eps) mean|e| <= atol + (rtol + eps) ||e|| / sqrt(n); for a sum, n atol + (rtol + eps)
// sqrt(n) ||e|| (n the run's output elements), so that no run that passes the full golden with
// such outputs fails its compact one.
Tolerance whole_rule(const Tolerance& tol, const Tolerance& rule, const StepRecord& s, const StepKey& k,
                     const TensorFile& golden) {
    if (tol.loss_of_outputs == Tolerance::OutputSum::none || k.kind() != "loss") return rule;
    const std::string output = fmt::format("step{}.output", k.step);
    const Tensor *norm = golden.find(output + ".norm"), *out = find_tensor(s, output);
    if (!norm || norm->numel() != 1 || !out || out->numel() == 0) return rule;
    const double n = static_cast<double>(out->numel()), v = norm->item(0);
    Tolerance r = rule;
    const double c = rule.rtol + tol.output_eps;
    r.atol += tol.loss_of_outputs == Tolerance::OutputSum::mean ? rule.atol + c * v / std::sqrt(n)
                                                                : n * rule.atol + c * std::sqrt(n) * v;
    return r;
}

}  // namespace

PlanReport compare_with_compact(const RunRecord& run, const TensorFile& golden, const Tolerance& tol,
                                const std::string& label) {
    PlanReport rep;
    rep.plan_path = label;
    rep.tol = tol;
    const int64_t n = sample_size(golden);
    for (const StepRecord& s : run.steps)
        for (const auto& [name, t] : s.tensors) {
            const auto k = parse_step_key(name);
            if (!k) continue;
            const Tolerance rule = rule_for(tol, name);
            TensorReport tr;
            tr.name = name;
            if (whole(k->kind())) {
                const Tensor* e = golden.find(name);
                if (e)
                    tr.diff = compare_tensors(t, e->to(t.dtype()), whole_rule(tol, rule, s, *k, golden));
                else
                    tr.diff.shape_ok = tr.diff.pass = false;
            } else {
                const Tensor *norm = golden.find(name + ".norm"), *sample = golden.find(name + ".sample");
                const int64_t m = std::min<int64_t>(t.numel(), n);
                if (!norm || !sample || norm->numel() != 1 || sample->numel() != m) {
                    tr.diff.shape_ok = tr.diff.pass = false;
                } else {
                    // the sample elementwise; the norm within what the elementwise rule implies for it
                    tr.diff = compare_tensors(sample_of(t, n), sample->to(DType::float64), rule);
                    const double a = frobenius(t), e = norm->to(DType::float64).data<double>()[0];
                    const double bound =
                        rule.atol * std::sqrt(static_cast<double>(t.numel())) + rule.rtol * std::abs(e);
                    const double err = std::abs(a - e),
                                 head = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
                    if (!(err <= bound)) tr.diff.pass = false;
                    if (head > tr.diff.headroom || std::isnan(head)) tr.diff.headroom = head;
                }
            }
            tr.pass = tr.diff.pass;
            tr.replicas = ReplicaState::sharded;
            (tr.pass ? rep.passed : rep.failed) += 1;
            rep.tensors.push_back(std::move(tr));
        }
    rep.pass = rep.failed == 0;
    return rep;
}

}  // namespace ptool
