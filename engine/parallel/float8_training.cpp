#include "parallel/float8_training.h"

#include <set>

#include "model/model.h"
#include "model/routed_experts.h"
#include "parallel/parallelize.h"
#include "parallel/style.h"

namespace ptool {
namespace {

// The recipes torchao names; only tensorwise runs here.
constexpr const char* kRecipes[] = {"tensorwise", "rowwise", "rowwise_with_gw_hp"};

// The dim of the weight a module's tensor-parallel style cuts.
Float8TpSplit split_of(const Module& m, const Resolution& res) {
    const ResolvedStyle* rs = res.style_of(m);
    if (!rs || !rs->entry || !rs->entry->style.style) return Float8TpSplit::none;
    for (const ParamPlacement& p : rs->entry->style.style->params(m))
        if (p.param == "weight" && p.placement.is_shard())
            return p.placement.dim == 0 ? Float8TpSplit::rows : Float8TpSplit::cols;
    return Float8TpSplit::none;
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
    const std::vector<std::string> names(std::begin(kRecipes), std::end(kRecipes));
    if (name != "tensorwise") {
        bool known = false;
        for (const std::string& n : names) known |= n == name;
        recipe.fail(
            known
                ? fmt::format("float8 recipe '{}': ptool runs tensorwise only so far (docs/float8.md)", name)
                : fmt::format("unknown float8 recipe '{}'{} (torchao's: tensorwise, rowwise, "
                              "rowwise_with_gw_hp)",
                              name, did_you_mean(name, names)));
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
    m.finish();
    return s;
}

std::vector<std::string> apply_float8(Model& model, const Float8Spec& spec, const Resolution& res) {
    const auto modules = named_modules(*model.root);
    const std::set<const Module*> experts = routed_expert_modules(model);
    const std::vector<std::string> filters = spec.filter_fqns.value_or(std::vector<std::string>{});
    const Module* head = nullptr;  // without filter_fqns: the output head, the last linear
    for (auto it = modules.rbegin(); !spec.filter_fqns && it != modules.rend() && !head; ++it)
        if (it->second->linear_features()) head = it->second;
    std::vector<std::string> out;
    for (const auto& [fqn, m] : modules) {
        if (experts.count(m) || m == head) continue;
        bool filtered = false;
        for (const std::string& f : filters) filtered |= fqn.find(f) != std::string::npos;
        if (filtered) continue;
        const auto features = m->linear_features();
        // float8 tensor cores take GEMM dims in multiples of 16 (torchtitan's module_filter_fn)
        if (!features || features->first % 16 != 0 || features->second % 16 != 0) continue;
        m->set_float8(Float8Gemms{spec.recipe, split_of(*m, res)});
        out.push_back(fqn);
    }
    if (out.empty())
        throw InputError(spec.where,
                         "float8: no linear of the model is converted (each needs in and out features "
                         "that are multiples of 16, outside filter_fqns and the routed experts)");
    return out;
}

}  // namespace ptool
