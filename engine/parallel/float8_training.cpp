#include "parallel/float8_training.h"

#include <algorithm>
#include <map>
#include <set>

#include "model/model.h"
#include "model/routed_experts.h"
#include "parallel/parallelize.h"
#include "parallel/plan.h"
#include "parallel/style.h"

namespace ptool {
namespace {

// Which dims of a tensor of `ndim` dims, seen as a linear's matrix operand ([tokens, features],
// a weight [out, in]), placement p cuts: its last dim the columns, any other the rows.
Float8Cut cut_of(const Placement& p, size_t ndim) {
    if (!p.is_shard()) return {};
    const bool cols = p.normalized(static_cast<int64_t>(ndim)).dim == static_cast<int64_t>(ndim) - 1;
    return {!cols, cols};
}

// Which of each module's tensors tp cuts, as the module itself computes on them in each of its
// calls: its weight by its style's placement of "weight"; its input as the style's rule hands it
// to the module (a rowwise linear's Shard(-1)) or, unstyled, as the layout pass places it (a
// sequence-parallel Shard(1)); its output gradient as its computed output (a colwise Shard(-1); a
// rowwise Partial's gradient is whole).
std::map<const Module*, Float8TpPieces> tp_pieces(const Resolution& res) {
    std::map<const Module*, Float8TpPieces> out;
    for (const CallLayout& c : res.layouts.calls) {
        Float8TpPieces& p = out[c.module];
        const ResolvedStyle* rs = c.style;
        const Style* style = rs && rs->entry ? rs->entry->style.style : nullptr;
        const size_t in_dims = c.in.global.size(), out_dims = c.out.global.size();
        if (!style) {
            p.input |= cut_of(c.in.p, in_dims), p.grad_output |= cut_of(c.out.p, out_dims);
            continue;
        }
        const StyleRule r = style->rule(*c.module, rs->entry->style);
        p.input |= cut_of(r.pre ? r.pre->to : c.in.p, in_dims);
        p.grad_output |= cut_of(r.post ? r.post->from : r.compute_out.value_or(c.out.p), out_dims);
        for (const ParamPlacement& w : style->params(*c.module))
            if (w.param == "weight") p.weight |= cut_of(w.placement, 2);
    }
    return out;
}

// Every module under a moe layer's routed experts.
std::set<const Module*> routed_expert_modules(const Model& model) {
    std::set<const Module*> out;
    for (const auto& [fqn, m] : named_modules(*model.root))
        if (const RoutedExperts* moe = m->routed_experts())
            for (int64_t e = 0; e < moe->experts(); ++e)
                for (const auto& [sub, child] : named_modules(moe->expert(e))) out.insert(child);
    return out;
}

}  // namespace

Float8Spec parse_float8(const YamlNode& node) {
    Float8Spec s;
    s.where = node.where();
    YamlMap m(node, "'float8'");
    const YamlNode recipe = m.at("recipe");
    const std::string name = recipe.as_string("'recipe'");
    if (!float8_recipe_named(name, &s.recipe)) {
        const std::vector<std::string>& names = float8_recipe_names();
        recipe.fail(fmt::format("unknown float8 recipe '{}'{}", name, did_you_mean(name, names)));
    }
    if (auto f = m.get("filter_fqns")) {
        std::vector<std::string> fqns;
        for (const YamlNode& item : f->items("'filter_fqns'")) {
            fqns.push_back(item.as_string("an entry of 'filter_fqns'"));
            if (fqns.back().empty())
                item.fail("an empty filter_fqns entry would keep every linear out of float8");
        }
        s.filter_fqns = std::move(fqns);
    }
    if (auto g = m.get("enable_fsdp_float8_all_gather")) {
        s.fsdp_float8_all_gather = g->as_bool("'enable_fsdp_float8_all_gather'");
        if (s.fsdp_float8_all_gather && s.recipe.scaling != Float8Scaling::tensorwise)
            g->fail(
                fmt::format("enable_fsdp_float8_all_gather casts a weight with one scale: torchao's "
                            "float8 all-gather takes recipe tensorwise, not {}",
                            name));
    }
    if (auto p = m.get("precompute_float8_dynamic_scale_for_fsdp")) {
        s.precompute_scale = p->as_bool("'precompute_float8_dynamic_scale_for_fsdp'");
        if (s.precompute_scale && !s.fsdp_float8_all_gather)
            p->fail(
                "precompute_float8_dynamic_scale_for_fsdp precomputes the scales of FSDP2's float8 "
                "all-gather: it needs enable_fsdp_float8_all_gather: true");
    }
    m.finish();
    return s;
}

bool float8_all_gathers(const Plan& plan, const DataParallelResolution& dp) {
    return !dp.units.empty() && float8_all_gathers(plan);
}

Module* float8_linear_of(const std::string& param, const std::map<std::string, Module*>& modules) {
    const size_t dot = param.rfind('.');
    if (dot == std::string::npos || param.substr(dot + 1) != "weight") return nullptr;
    const auto owner = modules.find(param.substr(0, dot));
    return owner != modules.end() && owner->second->float8() ? owner->second : nullptr;
}

bool float8_all_gathers(const Plan& plan) {
    if (!plan.float8 || !plan.float8->fsdp_float8_all_gather || !plan.data_parallel ||
        (plan.data_parallel->mode != DataParallelMode::fully_shard &&
         plan.data_parallel->fully_shard.empty()))
        return false;
    const ParallelDims& d = plan.dims;
    const int dim = d.shard_dim();
    const int shards =
        (dim < 0 ? 1 : d.size(*d.role(dim))) * (d.cp_shards_params() ? d.size(DimRole::cp) : 1);
    return shards > 1;
}

std::vector<std::pair<const Module*, Float8Gemms>> resolve_float8(const Model& model, const Float8Spec& spec,
                                                                  const Resolution& res) {
    const auto modules = named_modules(*model.root);
    const std::set<const Module*> experts = routed_expert_modules(model);
    const std::vector<std::string> filters = spec.filter_fqns.value_or(std::vector<std::string>{});
    const Module* head = nullptr;  // without filter_fqns: the output head, the last linear
    for (auto it = modules.rbegin(); !spec.filter_fqns && it != modules.rend() && !head; ++it)
        if (it->second->linear_features()) head = it->second;
    const auto pieces = tp_pieces(res);
    std::vector<std::pair<const Module*, Float8Gemms>> out;
    for (const auto& [fqn, m] : modules) {
        if (experts.count(m) || m == head) continue;
        bool filtered = false;
        for (const std::string& f : filters) filtered |= fqn.find(f) != std::string::npos;
        if (filtered) continue;
        const auto features = m->linear_features();
        // float8 tensor cores take GEMM dims in multiples of 16 (torchtitan's module_filter_fn)
        if (!features || features->first % 16 != 0 || features->second % 16 != 0) continue;
        // a linear the layout pass never saw: every piece reduced (a no-op when whole)
        const Float8Cut all{true, true};
        auto it = pieces.find(m);
        out.push_back({m, Float8Gemms{spec.recipe,
                                      it != pieces.end() ? it->second : Float8TpPieces{all, all, all}, fqn}});
    }
    if (out.empty())
        throw InputError(spec.where,
                         "float8: no linear of the model is converted (each needs in and out features "
                         "that are multiples of 16, outside filter_fqns and the routed experts)");
    return out;
}

void apply_float8(Model& model, const Resolution& res) {
    std::map<const Module*, const Float8Gemms*> chosen;
    for (const auto& [m, gemms] : res.float8) chosen[m] = &gemms;
    for_each_module(*model.root, [&](const std::string&, Module& m) {
        if (const auto it = chosen.find(&m); it != chosen.end()) m.set_float8(*it->second);
    });
}

std::vector<std::string> float8_linears(const Resolution& res) {
    std::vector<std::string> out;
    for (const auto& [m, gemms] : res.float8) out.push_back(m->fqn());
    return out;
}

}  // namespace ptool
