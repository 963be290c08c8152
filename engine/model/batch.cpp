#include "model/batch.h"

#include <algorithm>
#include <set>

#include "core/memory_account.h"
#include "core/rng.h"
#include "core/tensor_ops.h"
#include "core/yaml_reader.h"
#include "model/checkpoint.h"
#include "model/drawn_cache.h"
#include "model/layers.h"
#include "model/target_mask.h"

namespace ptool {

std::optional<StepKey> parse_step_key(const std::string& name) {
    const size_t dot = name.find('.');
    if (name.rfind("step", 0) != 0 || dot == std::string::npos || dot == 4 || dot > 9 ||
        name.find_first_not_of("0123456789", 4) != dot || dot + 1 == name.size() ||
        (name[4] == '0' && dot > 5))
        return std::nullopt;
    return StepKey{std::stoll(name.substr(4, dot - 4)), name.substr(dot + 1)};
}

namespace {

// A data file's key: input, target, step{k}.input or step{k}.target.
bool data_key(const std::string& name) {
    if (name == "input" || name == "target") return true;
    const auto key = parse_step_key(name);
    return key && (key->rest == "input" || key->rest == "target");
}

}  // namespace

void check_data_steps(const TensorFile& data, const std::string& path, int64_t steps) {
    if (data.tensors.empty())
        throw InputError(
            SourceLocation{path, 0, 0},
            "the data file holds no tensors (keys: input, target, step{k}.input, step{k}.target)");
    for (const auto& [name, t] : data.tensors)
        if (auto key = parse_step_key(name); key && key->step >= steps)
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("'{}' is for step {}, but the run has {} step{} (0..{})", name,
                                         key->step, steps, steps == 1 ? "" : "s", steps - 1));
    // per-step keys of a tensor without its plain key cover every step: a step without one would
    // train on generated data, silently (a data loader would have run out there); a file with a key
    // of another form is the DataSource's to refuse, naming it
    for (const auto& [name, t] : data.tensors)
        if (!data_key(name)) return;
    for (const char* what : {"input", "target"}) {
        if (data.find(what)) continue;
        int64_t given = 0, first = -1, missing = -1;  // steps with a key, the first with and without one
        for (int64_t k = 0; k < steps; ++k)
            if (data.find(fmt::format("step{}.{}", k, what)))
                ++given, first = first < 0 ? k : first;
            else if (missing < 0)
                missing = k;
        if (given == 0 || given == steps) continue;
        throw InputError(
            SourceLocation{path, 0, 0},
            fmt::format("'step{}.{}' is missing: the file holds step{{k}}.{} for {} of the run's {} "
                        "steps (step{}.{} ...) and no plain '{}' serves the others, which "
                        "would train on generated data",
                        missing, what, what, given, steps, first, what, what));
    }
}

namespace {

Tensor draw_tensor(const TensorSpec& spec, DType float_dtype, uint64_t seed, const std::string& what) {
    CounterRng rng(seed, stream_id("data", what));
    Tensor t = Tensor::empty(spec.shape, spec.ids ? DType::int64 : float_dtype);
    if (spec.ids) {
        int64_t* p = t.data<int64_t>();
        for (int64_t i = 0; i < t.numel(); ++i)
            p[i] = static_cast<int64_t>(rng.below(i, static_cast<uint64_t>(spec.range)));
        return t;
    }
    fill_normal(t, rng, 1.0);
    return t;
}

}  // namespace

Tensor generate_tensor(const TensorSpec& spec, DType float_dtype, uint64_t seed, const std::string& what) {
    if (meta_allocation_active())
        return Tensor(spec.shape,
                      spec.ids ? DType::int64 : float_dtype);  // a simulated step's batch: its shape
    const std::string key = fmt::format("data/{}/{}/{}/{}/{}", seed, what, shape_str(spec.shape),
                                        spec.ids ? "ids" : dtype_name(float_dtype), spec.range);
    // the other ranks of a verify wait for the first one's draw, then copy it (charged to their accounts)
    return drawn_tensors()
        .find_or_draw(key, [&] { return draw_tensor(spec, float_dtype, seed, what); })
        .clone();
}

DataSource::DataSource(const Model& model, const TensorFile* data_file, std::string data_path)
    : model_(model), file_(data_file), path_(std::move(data_path)) {
    gen_input_ = generate_tensor(model.input, model.dtype, model.seed, "input");
    if (model.target) gen_target_ = generate_tensor(*model.target, model.dtype, model.seed, "target");
    if (model.target_mask && gen_target_.defined())
        apply_target_mask(gen_target_, *model.target_mask, model.ignore_index, model.seed);
    if (!file_) return;
    std::vector<std::string> known = {"input", "target"};
    int64_t last_step = model.steps - 1;
    for (const auto& [name, t] : file_->tensors) {
        if (!data_key(name))
            throw InputError(
                SourceLocation{path_, 0, 0},
                fmt::format("unexpected tensor '{}' in a data file (keys: input, target, step{{k}}.input, "
                            "step{{k}}.target){}",
                            name, did_you_mean(name, known)));
        const auto key = parse_step_key(name);
        if (key) last_step = std::max(last_step, key->step);
        // a model without a target (loss sum/mean of its output) reads none: given, it was ignored
        if (!model.target && (name == "target" || (key && key->rest == "target")))
            throw InputError(SourceLocation{path_, 0, 0},
                             fmt::format("'{}': the model takes no target (its loss is {} of its output)",
                                         name, loss_name(model.loss)));
    }
    for (int64_t s = 0; s <= last_step; ++s) batch(s);  // validate every key's shape up front
}

bool DataSource::varies_per_step() const {
    if (!file_) return false;
    for (const auto& [name, t] : file_->tensors)
        if (name.rfind("step", 0) == 0) return true;
    return false;
}

Tensor DataSource::pick(const std::string& key, int64_t step, const TensorSpec& spec,
                        const Tensor& generated) const {
    if (!file_) return generated;
    const std::string step_key = fmt::format("step{}.{}", step, key);
    const Tensor* t = file_->find(step_key);
    std::string name = step_key;
    if (!t) t = file_->find(key), name = key;
    if (!t) return generated;
    if (t->shape() != spec.shape)
        throw InputError(SourceLocation{path_, 0, 0},
                         fmt::format("tensor '{}' is {}, the model's batch needs {}", name,
                                     shape_str(t->shape()), shape_str(spec.shape)));
    if (spec.ids) {
        if (dtype_is_float(t->dtype()))
            throw InputError(SourceLocation{path_, 0, 0},
                             fmt::format("tensor '{}' holds ids and must be int64 or int32, got {}", name,
                                         dtype_name(t->dtype())));
        for (int64_t i = 0; i < t->numel(); ++i) {
            const int64_t id = id_at(*t, i);  // exactly (through a double, 2^53 + 1 read as 2^53)
            if (id < 0 || id >= spec.range)
                if (!(key == "target" && id == model_.ignore_index))
                    throw InputError(
                        SourceLocation{path_, 0, 0},
                        fmt::format(
                            "tensor '{}' element {} is {}, outside [0, {}){}", name, i, id, spec.range,
                            key == "target" ? fmt::format(" and not the ignore_index {}", model_.ignore_index)
                                            : ""));
        }
        return t->to(DType::int64);
    }
    if (!dtype_is_float(t->dtype()))
        throw InputError(
            SourceLocation{path_, 0, 0},
            fmt::format("tensor '{}' must be floating point, got {}", name, dtype_name(t->dtype())));
    Tensor converted = t->to(model_.dtype);
    if (const int64_t i = first_nonfinite(converted); i >= 0)
        throw InputError(
            SourceLocation{path_, 0, 0},
            fmt::format("tensor '{}' element {} is {} in {}: a run on it would compare nothing meaningful",
                        name, i, converted.item(i), dtype_name(model_.dtype)));
    return converted;
}

Batch DataSource::batch(int64_t step) const {
    Batch b;
    b.input = pick("input", step, model_.input, gen_input_);
    if (model_.target) b.target = pick("target", step, *model_.target, gen_target_);
    return b;
}

void load_state_dict(Model& model, const TensorFile& checkpoint, const std::string& path) {
    const TensorFile file = to_state_dict_layout(model.checkpoint_format, checkpoint, path);
    std::set<std::string> expected, seen;
    for (const auto& [name, p] : model.state_dict()) expected.insert(name);
    for (const auto& [name, t] : file.tensors) {
        if (!expected.count(name))
            throw InputError(
                SourceLocation{path, 0, 0},
                fmt::format("unexpected key '{}' in the state_dict{}", name,
                            did_you_mean(name, std::vector<std::string>(expected.begin(), expected.end()))));
    }
    std::set<const Parameter*> loaded;  // a tied or shared parameter is satisfied by any of its names
    for (const auto& [name, p] : model.state_dict()) {
        const Tensor* t = file.find(name);
        if (!t) continue;
        if (t->shape() != p->value.shape())
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("'{}' is {} in the file, the model needs {}", name,
                                         shape_str(t->shape()), shape_str(p->value.shape())));
        if (dtype_is_float(t->dtype()) != dtype_is_float(p->value.dtype()))
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("'{}' is {} in the file, the model needs {}", name,
                                         dtype_name(t->dtype()), dtype_name(p->value.dtype())));
        Tensor converted = t->to(p->value.dtype());
        if (const int64_t i = first_nonfinite(converted); i >= 0)
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("'{}' element {} is {} in {}: a run from it would "
                                         "compare nothing meaningful",
                                         name, i, converted.item(i), dtype_name(converted.dtype())));
        copy_bytes(p->value.raw(), p->value.device(), converted.raw(), Device::cpu,
                   converted.nbytes());  // straight into device memory where the run built it there
        loaded.insert(p.get());
    }
    for (const auto& [name, p] : model.state_dict()) {
        if (loaded.count(p.get()) || p->value.dtype() == DType::int64)
            continue;  // num_batches_tracked may be absent
        throw InputError(SourceLocation{path, 0, 0}, fmt::format("missing key '{}' in the state_dict", name));
    }
}

}  // namespace ptool
