#include "verify/golden.h"

#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "backend/gpu_info.h"
#include "core/numbers.h"
#include "core/rng.h"
#include "core/yaml_reader.h"
#include "model/batch.h"
#include "model/optimizer.h"
#include "train/simulate.h"
#include "verify/loss_causes.h"

namespace ptool {
namespace fs = std::filesystem;

std::string text_hash(const std::string& text) {
    return fmt::format("{:016x}", stream_id(text));
}

TensorFile golden_tensors(const RunRecord& reference, const RunInputs& in, int64_t steps) {
    TensorFile file;
    for (const auto& [name, t] : reference.init_tensors) file.add(name, t);
    const Model probe = load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    const DataSource data(probe, in.data, in.data_path);
    const bool per_step = data.varies_per_step();
    for (int64_t k = 0; k < steps && k < static_cast<int64_t>(reference.steps.size()); ++k) {
        const std::string s = fmt::format("step{}.", k);
        const Batch b = data.batch(k);
        if (per_step || k == 0) {
            file.add((per_step ? s : std::string("data.")) + "input", b.input);
            if (b.target.defined()) file.add((per_step ? s : std::string("data.")) + "target", b.target);
        }
        const StepRecord& sr = reference.steps[k];
        for (const char* first : {"loss", "output", "grad_norm"})
            if (const Tensor* t = find_tensor(sr, s + first)) file.add(s + first, *t);
        for (const char* kind : {"grad.", "param.", "buffer."})
            for (const auto& [name, t] : sr.tensors)
                if (name.rfind(s + kind, 0) == 0) file.add(name, t);
    }
    return file;
}

TensorFile record_golden(const RunInputs& in, const Plan& plan, const VerifyOptions& opt) {
    const Model model = load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    // the reference runs the plan's microbatches on one device: they must be the plan's to run (the
    // data ranks' split too), or the golden would record a step no parallel run of the plan takes
    check_microbatches(plan, model);
    // verify's lint: a plan it refuses is not recorded (its golden's replay would be refused)
    resolve_plan(model, plan);
    const int64_t steps = steps_for(plan, opt, model.steps);
    // the one-device run it records, against the host's memory (before its batch is drawn): exit 3,
    // not the OOM killer
    require_host_memory(in, reference_plan(plan), steps);
    // a batch (or, under mean_per_call, a microbatch) with no valid target: a NaN loss its own replay
    // refuses (verify/loss_causes.h)
    require_valid_targets(model, plan, in, steps);
    RecordOptions ro;
    ro.events = false;
    ro.init_tensors = true;
    TensorFile file = golden_tensors(record_reference(in, plan, steps, ro), in, steps);
    const Tolerance tol = tolerance_for(plan, opt, model);
    char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(mpi_version, &len);
    const GpuInfo gpu = query_gpus();
    auto& md = file.metadata;
    md["model_yaml"] = in.model_text;
    md["plan_yaml"] = plan.yaml_text;
    md["model_hash"] = text_hash(in.model_text);
    md["plan_hash"] = text_hash(plan.yaml_text);
    md["model_path"] = in.model_path;
    md["plan_path"] = plan.path;
    md["dtype"] = dtype_name(model.dtype);
    md["device"] = device_name(in.device);
    md["steps"] = std::to_string(steps);
    md["rtol"] = fmt::format("{:g}", tol.rtol);
    md["atol"] = fmt::format("{:g}", tol.atol);
    if (tol.rel_fro > 0) md["rel_fro"] = fmt::format("{:g}", tol.rel_fro);  // low precision's Frobenius rule
    if (tol.masters) {  // mixed precision: the full-precision parameters' own rule
        md["master_rtol"] = fmt::format("{:g}", tol.masters->rtol);
        md["master_atol"] = fmt::format("{:g}", tol.masters->atol);
    }
    md["ptool_version"] = PTOOL_VERSION;
    md["openblas"] = openblas_get_config() ? openblas_get_config() : "";
    md["mpi"] = std::string(mpi_version, strnlen(mpi_version, sizeof mpi_version));
    md["cuda"] = gpu.runtime_version ? std::to_string(gpu.runtime_version) : "none";
    md["gpu"] = gpu.devices.empty() ? "none" : gpu.devices[0].name;
    md["gpu_sms"] = gpu.devices.empty() ? "0" : std::to_string(gpu.devices[0].sm_count);
    // cuBLAS is loaded only where it computes: a CPU record does not pay its 0.7 s start-up
    const int cublas = in.device == Device::cuda ? query_cublas_version() : 0;
    md["cublas"] = cublas ? std::to_string(cublas) : in.device == Device::cuda ? "none" : "unused (cpu)";
    md["nccl"] = gpu.nccl_version ? std::to_string(gpu.nccl_version) : "none";
    return file;
}

void golden_inputs(const TensorFile& g, TensorFile& init, TensorFile& data) {
    init.state_dict_layout =
        true;  // recorded with the model's names: hf_gpt2's conversion is not applied again
    for (const auto& [name, t] : g.tensors) {
        if (name.rfind("init.param.", 0) == 0)
            init.add(name.substr(11), t);
        else if (name.rfind("init.buffer.", 0) == 0)
            init.add(name.substr(12), t);
        else if (name == "data.input" || name == "data.target")
            data.add(name.substr(5), t);
        else if (auto key = parse_step_key(name); key && (key->rest == "input" || key->rest == "target"))
            data.add(name, t);
    }
}

namespace {

// A count in [1, max] written in decimal digits only (no sign, no spaces).
int64_t metadata_count(const std::string& path, const char* key, const std::string& text, int64_t max,
                       const char* what) {
    int64_t v = 0;
    size_t used = 0;
    try {
        if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos)
            v = std::stoll(text, &used);
    } catch (const std::exception&) {
    }
    if (used != text.size() || v < 1 || v > max)
        throw InputError(
            SourceLocation{path, 0, 0},
            fmt::format("__metadata__ '{}' is '{}': expected {} in [1, {}]", key, text, what, max));
    return v;
}

double metadata_tolerance(const std::string& path, const char* key, const std::string& text) {
    const double v = parse_finite(text).value_or(-1);  // the whole text: no hex, nan or inf
    if (v < 0)
        throw InputError(SourceLocation{path, 0, 0},
                         fmt::format("__metadata__ '{}' is '{}': expected a finite number >= 0", key, text));
    return v;
}

}  // namespace

GoldenCase load_golden(const std::string& path) {
    GoldenCase c;
    c.path = path;
    c.file = read_safetensors(path);
    auto need = [&](const char* key) -> std::string {
        auto it = c.file.metadata.find(key);
        if (it == c.file.metadata.end())
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("not a ptool golden file: __metadata__ has no '{}'", key));
        return it->second;
    };
    c.model_yaml = need("model_yaml");
    c.plan_yaml = need("plan_yaml");
    c.model_path = need("model_path");
    c.plan_path = need("plan_path");
    if (text_hash(c.model_yaml) != need("model_hash"))
        c.stale = "the recorded model text does not match its hash (edited)";
    else if (text_hash(c.plan_yaml) != need("plan_hash"))
        c.stale = "the recorded plan text does not match its hash (edited)";
    if (!c.stale.empty()) return c;  // nothing is built from an edited case's metadata
    const auto& md = c.file.metadata;
    if (md.count("steps")) c.steps = metadata_count(path, "steps", md.at("steps"), kMaxSteps, "a step count");
    if (md.count("rtol")) c.tolerance.rtol = metadata_tolerance(path, "rtol", md.at("rtol"));
    if (md.count("atol")) c.tolerance.atol = metadata_tolerance(path, "atol", md.at("atol"));
    if (md.count("rel_fro")) c.tolerance.rel_fro = metadata_tolerance(path, "rel_fro", md.at("rel_fro"));
    if (md.count("master_rtol"))
        c.tolerance.master_rtol = metadata_tolerance(path, "master_rtol", md.at("master_rtol"));
    if (md.count("master_atol"))
        c.tolerance.master_atol = metadata_tolerance(path, "master_atol", md.at("master_atol"));
    if (md.count("dtype")) {
        c.dtype = md.at("dtype");
        try {
            parse_dtype(c.dtype);
        } catch (const InputError& e) {
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("__metadata__ 'dtype': {}", e.message()));
        }
    }
    if (md.count("compact_sample"))
        c.compact_sample =
            metadata_count(path, "compact_sample", md.at("compact_sample"), 9999999, "a count");
    for (const auto& [name, t] : c.file.tensors)
        if (name.rfind("step", 0) == 0 && !parse_step_key(name))
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("tensor '{}': a step key must read step{{k}}.NAME", name));
    load_model_text(c.model_yaml, path + "[model_yaml]", c.dtype,
                    false);  // a case whose texts do not parse: exit 2
    load_plan_text(c.plan_yaml, path + "[plan_yaml]");
    for (const auto& [file, text] :
         {std::pair{c.model_path, c.model_yaml}, std::pair{c.plan_path, c.plan_yaml}}) {
        std::error_code ec;
        if (!c.stale.empty() || file.find('\0') != std::string::npos || !fs::is_regular_file(file, ec))
            continue;
        // the sizes first: a path naming some large other file is not read whole to learn it differs
        const uintmax_t size = fs::file_size(file, ec);
        bool same = !ec && size == text.size();
        if (same) {
            try {
                same = read_file(file, text.size()) == text;
            } catch (const InputError&) {  // unreadable now: it is not the recorded text
                same = false;
            }
        }
        if (!same)
            c.stale =
                fmt::format("{} changed since it was recorded (re-record with `ptool golden record`)", file);
    }
    return c;
}

namespace {

// Every tensor a golden may hold for its model over `steps` steps, with the shape the model fixes
// (nullopt: any, the output's).
std::map<std::string, std::optional<Shape>> implied_tensors(const GoldenCase& c, const Model& model,
                                                            int64_t steps) {
    std::map<std::string, std::optional<Shape>> out;
    const auto params = model.named_parameters(), buffers = model.named_buffers();
    const std::optional<Shape> scalar = Shape{};
    auto numel = [](const Shape& s) {
        int64_t n = 1;
        for (int64_t d : s) n *= d;
        return n;
    };
    auto add = [&](const std::string& name, const std::optional<Shape>& shape) {
        if (!c.compact_sample) {
            out[name] = shape;
            return;
        }
        out[name + ".norm"] = Shape{1};
        out[name + ".sample"] =
            shape ? std::optional<Shape>(Shape{std::min(numel(*shape), c.compact_sample)}) : std::nullopt;
    };
    if (!c.compact_sample) {
        for (const auto& [name, p] : params) out["init.param." + name] = p->value.shape();
        for (const auto& [name, b] : buffers) out["init.buffer." + name] = b->value.shape();
        out["data.input"] = model.input.shape;
        if (model.target) out["data.target"] = model.target->shape;
    }
    for (int64_t k = 0; k < steps; ++k) {
        const std::string s = fmt::format("step{}.", k);
        if (!c.compact_sample) {
            out[s + "input"] = model.input.shape;
            if (model.target) out[s + "target"] = model.target->shape;
        }
        out[s + "loss"] = scalar;
        if (model.clip_grad_norm > 0) out[s + "grad_norm"] = scalar;
        add(s + "output", std::nullopt);
        for (const auto& [name, p] : params)
            add(s + "grad." + name, p->value.shape()), add(s + "param." + name, p->value.shape());
        for (const auto& [name, b] : buffers) add(s + "buffer." + name, b->value.shape());
    }
    return out;
}

}  // namespace

void require_golden_tensors(const GoldenCase& c, const Model& model, int64_t steps) {
    if (c.steps > 0 && steps > c.steps)
        throw InputError(SourceLocation{c.path, 0, 0},
                         fmt::format("the golden recorded {} step{}; {} asked for (--steps, or the plan's "
                                     "verify.steps)",
                                     c.steps, c.steps == 1 ? "" : "s", steps));
    // what it holds is what its model implies over its recorded steps, in the shapes the model fixes:
    // a tensor nothing reads (an added one, a target for a model without one, a step past the
    // recorded ones) was ignored, one of another shape failed as "missing or shape differs"
    const auto implied = implied_tensors(c, model, std::max(steps, c.steps));
    for (const auto& [name, t] : c.file.tensors) {
        auto it = implied.find(name);
        if (it == implied.end())
            throw InputError(SourceLocation{c.path, 0, 0},
                             fmt::format("the golden holds '{}', which its model does not imply over its {} "
                                         "recorded step{} (a damaged or edited file?)",
                                         name, c.steps, c.steps == 1 ? "" : "s"));
        if (it->second && t.shape() != *it->second)
            throw InputError(SourceLocation{c.path, 0, 0},
                             fmt::format("the golden's '{}' is {}, its model implies {} (a damaged file?)",
                                         name, shape_str(t.shape()), shape_str(*it->second)));
        // weights, gradients, outputs and losses are floats: an integer one read float bits as
        // integers (a FAIL of 1e9 where the file is damaged)
        const auto k = parse_step_key(name);
        const bool real = name.rfind("init.param.", 0) == 0 ||
                          (k && (k->kind() == "grad" || k->kind() == "param" || k->kind() == "output" ||
                                 k->kind() == "loss" || k->kind() == "grad_norm"));
        if (real && !dtype_is_float(t.dtype()))
            throw InputError(SourceLocation{c.path, 0, 0},
                             fmt::format("the golden's '{}' is {}, where its model computes a float (a "
                                         "damaged file?)",
                                         name, dtype_name(t.dtype())));
    }
    std::set<std::string> held;
    for (const auto& [name, t] : c.file.tensors) held.insert(name);
    auto need = [&](const std::string& name) {
        if (!held.count(name))
            throw InputError(SourceLocation{c.path, 0, 0},
                             fmt::format("the golden has no '{}', which its model implies over {} "
                                         "step{} (a stripped or damaged file?)",
                                         name, steps, steps == 1 ? "" : "s"));
    };
    const auto params = model.named_parameters(), buffers = model.named_buffers();
    if (c.compact_sample) {  // no init or data; per step the losses whole, the rest as norm and sample
        auto compact = [&](const std::string& name) { need(name + ".norm"), need(name + ".sample"); };
        for (int64_t k = 0; k < steps; ++k) {
            const std::string s = fmt::format("step{}.", k);
            need(s + "loss");
            if (model.clip_grad_norm > 0) need(s + "grad_norm");
            compact(s + "output");
            for (const auto& [name, p] : params) compact(s + "grad." + name), compact(s + "param." + name);
            for (const auto& [name, b] : buffers) compact(s + "buffer." + name);
        }
        return;
    }
    for (const auto& [name, p] : params) need("init.param." + name);
    for (const auto& [name, b] : buffers) need("init.buffer." + name);
    for (int64_t k = 0; k < steps; ++k) {
        const std::string s = fmt::format("step{}.", k);
        for (const char* what : {"input", "target"}) {
            if (std::string(what) == "target" && !model.target) continue;
            if (!held.count(std::string("data.") + what)) need(s + what);
        }
        need(s + "loss");
        if (model.clip_grad_norm > 0) need(s + "grad_norm");
        need(s + "output");
        for (const auto& [name, p] : params) need(s + "grad." + name), need(s + "param." + name);
        for (const auto& [name, b] : buffers) need(s + "buffer." + name);
    }
}

namespace {

// The golden's parameters that are what ptool's optimizer makes of the golden's own gradients,
// stepped from its init.param.* (AdamW, or any optimizer under mixed precision; empty otherwise).
std::set<std::string> consistent_updates(const TensorFile& golden, const OptimizerSpec& spec,
                                         const Tolerance& tol) {
    std::set<std::string> out;
    if (spec.type != OptimizerType::adamw && !tol.masters) return out;
    std::vector<std::pair<std::string, ParamPtr>> shadow;
    for (const auto& [name, t] : golden.tensors)
        if (name.rfind("init.param.", 0) == 0) {
            auto p = std::make_shared<Parameter>();
            p->value = t.clone();
            shadow.emplace_back(name.substr(11), p);
        }
    Optimizer opt(spec, backend_for(Device::cpu));
    for (int64_t k = 0;; ++k) {
        const std::string s = fmt::format("step{}.", k);
        for (auto& [name, p] : shadow) {
            const Tensor* g = golden.find(s + "grad." + name);
            if (!g) return out;
            p->grad = g->to(p->value.dtype());
        }
        opt.step(shadow);
        for (const auto& [name, p] : shadow)
            if (const Tensor* v = golden.find(s + "param." + name);
                v && compare_tensors(v->to(p->value.dtype()), p->value, tol.for_masters()).pass)
                out.insert(s + "param." + name);
    }
}

}  // namespace

PlanReport compare_with_golden(const RunRecord& run, const TensorFile& golden, const Tolerance& tol,
                               const std::string& label, const OptimizerSpec& optimizer, bool reference) {
    PlanReport rep;
    rep.plan_path = label;
    rep.tol = tol;
    // the run's steps (every step it was asked for: a failed rank ends it with an error): a golden of
    // more steps is compared over the first ones (--steps fewer than recorded), as a prefix of it
    const int64_t ran = static_cast<int64_t>(run.steps.size());
    int64_t recorded = 0;
    for (const auto& [name, expected] : golden.tensors) {
        const auto key = parse_step_key(name);  // validated by load_golden
        if (!key || key->kind() == "input" || key->kind() == "target") continue;
        const int64_t step = key->step;
        recorded = std::max(recorded, step + 1);
        if (step >= ran) continue;
        TensorReport tr;
        tr.name = name;
        tr.replicas = ReplicaState::sharded;
        tr.diff.shape_ok = tr.diff.pass = false;  // missing, unless the run has it
        if (step < static_cast<int64_t>(run.steps.size())) {
            const StepRecord& sr = run.steps[step];
            auto it = sr.replicas.find(name);
            if (it != sr.replicas.end()) tr.replicas = it->second;
            if (const Tensor* actual = find_tensor(sr, name))
                tr.diff = compare_tensors(*actual, expected.to(actual->dtype()), rule_for(tol, name));
            else if (auto d = sr.vs_golden.find(name); d != sr.vs_golden.end())
                tr.diff = d->second;  // compared as recorded
        }
        tr.pass = tr.diff.pass ||
                  (tr.diff.shape_ok &&
                   tr.replicas == ReplicaState::ignored);  // an ignored module's tensors differ by design
        (tr.pass ? rep.passed : rep.failed) += 1;
        rep.tensors.push_back(std::move(tr));
    }
    if (recorded > ran)
        rep.notes.push_back(fmt::format("the golden recorded {} steps; its first {} compared (the steps run)",
                                        recorded, ran));
    // the module rules, but not the systematic one: a golden may come from other kernels (PyTorch's,
    // a GPU's), whose softmax and reductions part from ptool's by more than the order of a sum
    Tolerance module_tol = tol;
    module_tol.systematic = 0;
    judge_by_module(rep, module_tol);
    judge_loss_by_outputs(rep, tol, [&golden](const std::string& n) { return golden.find(n); });
    const std::set<std::string> golden_ok = consistent_updates(golden, optimizer, tol);
    apply_update_rule(rep, [&](const std::string& name) {
        if (!golden_ok.count(name)) return false;
        if (reference) return true;
        const auto k = parse_step_key(name);
        if (k->step >= static_cast<int64_t>(run.steps.size())) return false;
        const auto& shadow = run.steps[k->step].vs_shadow;
        auto it = shadow.find(name);
        return it != shadow.end() && it->second.pass;
    });
    fail_nonfinite(rep, reference ? "the reference" : "the parallel run", "the golden");
    rep.pass = rep.failed == 0;
    return rep;
}

bool looks_like_golden_arg(const std::string& arg) {
    std::error_code ec;
    return fs::is_directory(arg, ec) || (arg.size() > 12 && arg.substr(arg.size() - 12) == ".safetensors");
}

std::vector<std::string> golden_paths(const std::vector<std::string>& args) {
    std::vector<std::string> out;
    for (const auto& a : args) {
        std::error_code ec;
        if (fs::is_directory(a, ec)) {
            std::vector<std::string> found;
            for (const auto& e : fs::directory_iterator(a))
                if (e.path().extension() == ".safetensors" && e.path().filename().string()[0] != '.')
                    found.push_back(e.path().string());
            std::sort(found.begin(), found.end());
            if (found.empty())
                throw InputError(SourceLocation{a, 0, 0}, "folder holds no *.safetensors golden files");
            out.insert(out.end(), found.begin(), found.end());
        } else {
            out.push_back(a);
        }
    }
    return out;
}

}  // namespace ptool
