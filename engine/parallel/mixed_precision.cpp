#include "parallel/mixed_precision.h"

#include "core/fqn_pattern.h"
#include "model/float8_gemm.h"
#include "model/float8_linear.h"
#include "parallel/float8_training.h"

namespace ptool {

MixedPrecision::MixedPrecision(Model& model, const MixedPrecisionSpec& spec, Backend& be,
                               const std::function<bool(const Parameter*)>& managed_elsewhere,
                               const std::vector<std::string>& float8_units)
    : spec_(spec), be_(be) {
    if (spec.param_dtype == model.dtype) return;
    const auto float8 = float8_weights(model, float8_units);
    for (const auto& [name, p] : model.named_parameters())
        if (!managed_elsewhere(p.get())) {
            const auto f = float8.find(p.get());
            entries_.push_back({p, {}, {}, {}, {}, f == float8.end() ? nullptr : f->second});
        }
}

// The float8 linears' weights under the units (fully_shard's rule, by name: a `.weight` whose module
// is a float8 linear, the name the parameter goes by in named_parameters).
std::map<const Parameter*, const Float8Gemms*> MixedPrecision::float8_weights(
    const Model& model, const std::vector<std::string>& float8_units) {
    std::map<const Parameter*, const Float8Gemms*> out;
    if (float8_units.empty()) return out;
    std::map<std::string, Module*> modules;
    std::vector<std::string> names;
    for_each_module(*model.root,
                    [&](const std::string& fqn, Module& m) { modules[fqn] = &m, names.push_back(fqn); });
    const NameIndex index(names);
    std::vector<std::string> units;  // the units' FQNs
    for (const std::string& pattern : float8_units)
        if (pattern.empty())
            units.push_back("");
        else
            for (size_t i : index.matches(pattern)) units.push_back(names[i]);
    for (const auto& [name, p] : model.named_parameters()) {
        if (Module* linear = float8_linear_of(name, modules); linear && fqn_under_any(name, units))
            out.emplace(p.get(), linear->float8());
    }
    return out;
}

// The weight's float8 codes, cast from the master with the master's own scale (torchao's
// pre-all-gather cast of the sharded master, here whole).
Tensor MixedPrecision::float8_copy(Entry& e) const {
    const Float8Format f = e.float8->recipe.weight;
    const float scale = float8_tensorwise_scale(float8_amax(e.master), f);
    Tensor codes = Tensor::empty(e.master.shape(), DType::uint8, e.master.device());
    float8_cast_codes(e.master, f, scale, codes);
    e.p->float8_scale = scale;
    return codes;
}

void MixedPrecision::to_compute() {
    MemoryUseScope use(MemoryUse::mixed_precision);
    for (Entry& e : entries_) {
        e.master = e.p->value, e.master_grad = e.p->grad;  // the grad may be a DDP bucket's view: kept
        e.value = e.float8 ? float8_copy(e) : to_dtype(be_, e.master, spec_.param_dtype);
        if (!e.grad.defined()) e.grad = Tensor::empty(e.master.shape(), spec_.param_dtype, e.master.device());
        be_.fill(e.grad, 0.0);
        e.p->value = e.value, e.p->grad = e.grad;
    }
}

void MixedPrecision::to_masters() {
    for (Entry& e : entries_) {
        be_.copy(e.grad, e.master_grad);  // param_dtype -> the master's
        e.p->value = e.master, e.p->grad = e.master_grad, e.p->float8_scale = 0;
        e.value = Tensor();                   // the copy lives for one step, as FSDP's unsharded parameters
        e.master = e.master_grad = Tensor();  // the parameter holds them (ZeRO-2 then frees the gradient)
    }
}

void check_mixed_precision(const Model& model, const Plan& plan,
                           const std::vector<std::string>& unmanaged_params) {
    if (!plan.mixed_precision) return;
    const MixedPrecisionSpec& mp = *plan.mixed_precision;
    if (mp.param_dtype == model.dtype) return;  // nothing is cast (reduce_dtype alone: the buckets)
    if (!unmanaged_params.empty())
        throw InputError(
            mp.where,
            fmt::format("mixed_precision casts the parameters data_parallel manages, and '{}' is not "
                        "one (ignored, or outside the replicate() roots): its {} weight would meet "
                        "{} activations, which PyTorch refuses. Manage it, or drop mixed_precision",
                        unmanaged_params[0], dtype_name(model.dtype), dtype_name(mp.param_dtype)));
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        if (m.batch_statistics())
            throw InputError(mp.where,
                             fmt::format("mixed_precision with batch_norm '{}': its running statistics are "
                                         "buffers in {} that no policy here casts; ptool does not run it",
                                         fqn, dtype_name(model.dtype)));
    });
    if (!mp.cast_forward_inputs && !model.input.ids)
        throw InputError(mp.where,
                         fmt::format("cast_forward_inputs: false leaves the {} input as it is, and the first "
                                     "layer's {} weights would meet it (PyTorch refuses the mix): cast it "
                                     "(cast_forward_inputs: true)",
                                     dtype_name(model.dtype), dtype_name(mp.param_dtype)));
}

}  // namespace ptool
