#include "parallel/parallelize.h"

#include <algorithm>
#include <atomic>

#include "core/tensor_ops.h"
#include "model/routed_experts.h"
#include "parallel/context_parallel.h"
#include "parallel/float8_training.h"

namespace ptool {
namespace {

std::atomic<int64_t> resolutions{0};  // resolve_plan_count's

bool shards_any(const std::vector<ParamPlacement>& params) {
    for (const ParamPlacement& pp : params)
        if (pp.placement.is_shard()) return true;
    return false;
}

// Each module matched by exactly one pattern, and the style applies to it.
std::map<const Module*, const PlanEntry*> match_patterns(const Model& model, const Plan& plan,
                                                         Resolution& res) {
    std::map<const Module*, const PlanEntry*> owner;
    const auto modules = named_modules(*model.root);
    std::vector<std::string> names;
    for (const auto& [fqn, module] : modules) names.push_back(fqn);
    const NameIndex index(std::move(names));
    for (const PlanEntry& e : plan.tp_plan) {
        int matched = 0;
        for (const size_t i : index.matches(e.pattern)) {
            const std::string& fqn = modules[i].first;
            Module& m = *modules[i].second;
            ++matched;
            if (!e.style.style->applies_to(m))
                throw InputError(e.where,
                                 fmt::format("'{}' matches '{}', a {}: {} applies to {}", e.pattern, m.fqn(),
                                             m.type(), e.style.name(), e.style.style->applies_to_text()));
            if (owner.count(&m))
                throw InputError(e.where,
                                 fmt::format("'{}' and '{}' (line {}) both match '{}': one style per module",
                                             e.pattern, owner[&m]->pattern, owner[&m]->where.line, fqn));
            owner[&m] = &e;
        }
        if (!matched)
            res.warnings.push_back({e.where, fmt::format("pattern '{}' matched no module", e.pattern),
                                    DiagnosticKind::unmatched_pattern});
    }
    return owner;
}

// The model input arrives as the declared input of the first styled module on the path of first
// children (a rowwise first layer gets each rank's chunk of the input's last dim, as PyTorch's
// rowwise test feeds it); Replicate when there is none.
Placement model_input_placement(const Model& model, const std::map<const Module*, const PlanEntry*>& owner) {
    for (const Module* m = model.root.get(); m;
         m = m->children().empty() ? nullptr : m->children()[0].second.get()) {
        auto it = owner.find(m);
        if (it == owner.end()) continue;
        auto pre = it->second->style.style->rule(*m, it->second->style).pre;
        if (!pre) continue;
        if (pre->from.is_partial())  // the batch is data, not summands
            throw InputError(it->second->where,
                             fmt::format("'{}' declares the model input Partial(sum): the batch is data, "
                                         "not partial sums; declare replicate or shard(d)",
                                         m->fqn().empty() ? "(root)" : m->fqn()));
        return pre->from;
    }
    return Placement::replicate();
}

// A parameter owned by several modules (`tie:`, `shared`) is one tensor: every module that uses it
// must see it placed the same way (Megatron's shared embedding: the vocabulary sharded for the
// embedding's rowwise and the head's colwise alike), and its gradient sums every use on each rank.
void check_tied(const Model& model, const std::map<const Module*, const PlanEntry*>& owner) {
    struct Use {
        const Module* module;
        Placement placement;
        const PlanEntry* entry;
    };
    std::map<const Parameter*, std::vector<Use>> uses;
    for_each_module(*model.root, [&](const std::string&, Module& m) {
        auto it = owner.find(&m);
        for (const auto& e : m.params()) {
            Placement p = Placement::replicate();  // unstyled, or a style that leaves it whole
            if (it != owner.end())
                for (const ParamPlacement& pp : it->second->style.style->params(m))
                    if (pp.param == e.name) p = pp.placement;
            uses[e.param.get()].push_back({&m, p, it == owner.end() ? nullptr : it->second});
        }
    });
    for (const auto& [param, list] : uses) {
        if (list.size() < 2) continue;
        const int64_t nd = param->value.dim();
        for (const Use& u : list) {
            if (u.placement.same_as(list[0].placement, nd)) continue;
            const Use& styled = u.entry ? u : list[0];
            const Use& other = u.entry ? list[0] : u;
            auto describe = [](const Use& x) {
                return x.entry ? fmt::format("'{}' ({}) places it {}", x.module->fqn(), x.entry->style.name(),
                                             x.placement.str())
                               : fmt::format("'{}' (unstyled) uses it whole", x.module->fqn());
            };
            throw InputError(
                styled.entry ? styled.entry->where : other.entry->where,
                fmt::format("'{}' and '{}' share one parameter: {} but {}; place it the same way for every "
                            "module that uses it (Megatron's tied embedding: rowwise on the embedding, "
                            "colwise on the head, both Shard(0))",
                            list[0].module->fqn(), u.module->fqn(), describe(styled), describe(other)));
        }
    }
}

void resolve_tensor_parallel(const Model& model, const Plan& plan, Resolution& res) {
    if (plan.tp_plan.empty())
        res.warnings.push_back({plan.tp_plan_where,
                                "the tensor_parallel plan is empty: nothing is parallelized",
                                DiagnosticKind::empty_plan});
    const auto owner = match_patterns(model, plan, res);
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        auto it = owner.find(&m);
        if (it == owner.end()) return;
        res.styles.push_back({fqn, &m, it->second});
        it->second->style.style->check(
            {model, m, it->second->pattern, it->second->where, res.tp, res.warnings, it->second->style});
    });
    check_tied(model, owner);
    res.input_placement = model_input_placement(model, owner);
}

}  // namespace

bool builds_own_pieces(const ResolvedStyle& rs) {
    return shards_any(rs.entry->style.style->params(*rs.module));
}

bool distributes_all_own(const ResolvedStyle& rs) {
    const std::vector<ParamPlacement> params = rs.entry->style.style->params(*rs.module);
    for (const auto& e : rs.module->params())
        if (std::none_of(params.begin(), params.end(),
                         [&](const ParamPlacement& pp) { return pp.param == e.name; }))
            return false;
    return !rs.module->params().empty();
}

const ResolvedStyle* Resolution::style_of(const Module& m) const {
    for (const ResolvedStyle& rs : styles)
        if (rs.module == &m) return &rs;
    return nullptr;
}

int64_t resolve_plan_count() {
    return resolutions.load();
}

Resolution resolve_plan(const Model& model, const Plan& plan) {
    ++resolutions;
    Resolution res;
    res.tp = plan.dims.size(DimRole::tp);
    res.checkpointing = resolve_activation_checkpointing(model, plan.activation_checkpointing, res.warnings);
    check_microbatches(plan, model);  // the step's microbatches cut the batch and split over the data ranks
    check_loss_normalization(plan.normalization(model), model.loss, plan.normalization_where(model));
    const int64_t microbatches = plan.accumulation_rounds(model) * plan.microbatches_per_round();
    res.dp = resolve_data_parallel(model, plan, res.warnings, res.causes);
    res.ep = resolve_expert_parallel(model, plan);
    // what a moe layer's options need of the plan: a capacity keeps slots in the microbatch's token
    // order, which interleaves the cp ranks' positions (no context parallel)
    const bool cp = plan.context_parallel && plan.dims.size(DimRole::cp) > 1;
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        const RoutedExperts* moe = m.routed_experts();
        if (!moe) return;
        if (cp && moe->capacity_factor() > 0)
            throw InputError(
                plan.context_parallel->where,
                fmt::format("context_parallel with an expert capacity (moe '{}' has capacity_factor): "
                            "its slots are kept in the microbatch's token order, which interleaves "
                            "the cp ranks' positions; not modelled yet",
                            fqn));
    });
    if (plan.dims.has(DimRole::tp)) resolve_tensor_parallel(model, plan, res);
    std::map<const Module*, const ResolvedStyle*> styles;
    for (const ResolvedStyle& rs : res.styles) styles[rs.module] = &rs;
    Shape rows = model.input.shape;  // one dp rank's rows (the batch splits evenly: checked above)
    if (!rows.empty()) rows[0] /= res.dp.size * microbatches;  // and one microbatch's
    check_context_parallel(model, plan);
    if (plan.context_parallel) rows[1] /= plan.dims.size(DimRole::cp);  // and one cp rank's positions
    LayoutPassOptions options;
    options.loss_parallel = plan.loss_parallel;
    options.checkpointed = res.checkpointing.checkpointed;
    if (plan.mixed_precision) options.compute = plan.mixed_precision->param_dtype;
    res.layouts =
        propagate_layouts(model, styles, {rows, res.input_placement}, res.tp,
                          plan.dims.has(DimRole::tp) ? plan.tp_plan_where : plan.mesh_where, options);
    if (plan.loss_parallel) {  // the loss must be a cross_entropy over classes the output holds sharded
        const Layout& out = res.layouts.output;
        const int64_t nd = static_cast<int64_t>(out.global.size());
        if (model.loss != LossKind::cross_entropy || !out.p.same_as(Placement::shard(-1), nd))
            throw InputError(
                plan.loss_parallel_where,
                fmt::format(
                    "loss_parallel computes cross_entropy on an output sharded over its classes (Shard(-1)); "
                    "this model's loss is {} on an output {}: style its head colwise with output_layouts "
                    "shard(-1), or drop loss_parallel",
                    loss_name(model.loss), out.str()));
    }
    res.warnings.insert(res.warnings.end(), res.layouts.warnings.begin(), res.layouts.warnings.end());
    if (plan.float8) res.float8 = resolve_float8(model, *plan.float8, res);  // from the layouts' calls
    return res;
}

TpParams parallelize(Model& model, const Plan& plan, const Resolution& res, DeviceMesh& mesh,
                     bool build_own_shards) {
    TpParams out;
    if (!plan.dims.has(DimRole::tp)) return out;
    Communicator& comm = mesh.comm(plan.dims.index(DimRole::tp));
    const int n = comm.size(), r = comm.rank();
    auto counter = mesh.counter();
    for (const ResolvedStyle& rs : res.styles) {
        if (counter) counter->set_module(rs.fqn);  // src_data_rank's broadcasts are counted under the module
        const StyleSpec& spec = rs.entry->style;
        const std::vector<ParamPlacement> params = spec.style->params(*rs.module);
        for (const ParamPlacement& pp : params) {
            ParamPtr p = rs.module->param(pp.param);
            if (out.count(p.get())) continue;  // tied: distributed once, for every module that shares it
            const Shape global = p->value.shape();
            const int64_t dim = pp.placement.is_shard()
                                    ? normalize_dim(pp.placement.dim, static_cast<int64_t>(global.size()))
                                    : -1;
            Tensor local;
            MemoryUseScope use(MemoryUse::parameters);
            if (build_own_shards && dim < 0 &&
                !shards_any(params)) {  // initialised whole, as the module's own
                local = p->value;
            } else if (build_own_shards) {  // draw this rank's piece only: no communication, no full tensor
                local = Tensor::empty(local_shape(global, pp.placement, n, r), p->value.dtype());
                rs.module->init_shard(model.seed, pp.param, local, dim,
                                      dim < 0 ? 0 : chunk_of(global[dim], n, r).offset);
            } else {
                Tensor full = p->value;
                if (plan.src_data_rank) {  // rank k's weights are the source; the others' must not matter
                    if (r != *plan.src_data_rank) poison_replica(full, r);
                    comm.broadcast(full, *plan.src_data_rank);
                }
                local = dim < 0 ? full : chunk(full, n, r, dim);
            }
            p->value = local;
            MemoryUseScope grads(MemoryUse::gradients);
            p->grad = Tensor::empty(local.shape(), local.dtype(), local.device());
            out[p.get()] = {pp.placement, global};
        }
        rs.module->set_hooks(spec.style->install(*rs.module, spec, comm));
    }
    if (counter) counter->set_module("");
    return out;
}

}  // namespace ptool
