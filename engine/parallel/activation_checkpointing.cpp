#include "parallel/activation_checkpointing.h"

#include <functional>
#include <set>
#include <utility>

#include "model/attention_core.h"
#include "model/model.h"
#include "parallel/plan.h"

namespace ptool {
namespace {

struct ModeRow {
    RecomputeMode mode;
    const char* name;
};
constexpr ModeRow kModes[] = {
    {RecomputeMode::full, "full"},
    {RecomputeMode::op, "op"},
    {RecomputeMode::core_attn, "core_attn"},
};

constexpr int64_t kMaxEvery = 1 << 20;

std::vector<std::string> patterns(const YamlNode& node, const char* what) {
    std::vector<std::string> out;
    for (const YamlNode& item : node.items(fmt::format("'{}'", what)))
        out.push_back(item.as_string(fmt::format("an entry of '{}'", what)));
    if (out.empty()) node.fail(fmt::format("'{}' is empty: name the modules to checkpoint", what));
    return out;
}

// Every attention at or under m, in registration order.
void attentions_under(Module& m, std::vector<std::pair<Module*, AttentionCore*>>& out) {
    if (AttentionCore* a = m.attention_core()) out.emplace_back(&m, a);
    for (const auto& [name, child] : m.children()) attentions_under(*child, out);
}

}  // namespace

const char* recompute_mode_name(RecomputeMode m) {
    for (const ModeRow& r : kModes)
        if (r.mode == m) return r.name;
    return "?";
}

ActivationCheckpointingSpec parse_activation_checkpointing(const YamlNode& node) {
    ActivationCheckpointingSpec s;
    s.where = node.where();
    if (!node.is_map()) {  // the list form: full checkpointing of every matching module
        s.modules = patterns(node, "activation_checkpointing");
        return s;
    }
    YamlMap m(node, "'activation_checkpointing'");
    const YamlNode modules = m.at("modules");
    s.modules = patterns(modules, "modules");
    if (auto v = m.get("mode")) {
        const std::string name = v->as_string("'mode'");
        std::vector<std::string> names;
        bool found = false;
        for (const ModeRow& r : kModes) {
            names.push_back(r.name);
            if (name == r.name) s.mode = r.mode, found = true;
        }
        if (!found)
            v->fail(fmt::format("unknown activation_checkpointing mode '{}'{} (full, op or core_attn)", name,
                                did_you_mean(name, names)));
    }
    if (auto v = m.get("every")) {
        const int64_t every = v->as_positive_int("'every'");
        if (every > kMaxEvery) v->fail(fmt::format("'every' {} is over the limit of {}", every, kMaxEvery));
        s.every = static_cast<int>(every);
    }
    m.finish();
    return s;
}

ActivationCheckpointing resolve_activation_checkpointing(const Model& model,
                                                         const ActivationCheckpointingSpec& spec,
                                                         std::vector<Diagnostic>& warnings) {
    ActivationCheckpointing out;
    if (!spec.active()) return out;
    const auto modules = named_modules(*model.root);
    std::vector<std::string> names;
    for (const auto& [fqn, m] : modules) names.push_back(fqn);
    const NameIndex index(std::move(names));
    std::vector<size_t> found(spec.modules.size(), 0);
    std::vector<bool> matches(modules.size(), false);
    for (size_t i = 0; i < spec.modules.size(); ++i)
        for (const size_t k : index.matches(spec.modules[i])) matches[k] = true, ++found[i];
    int matched = 0;  // matching modules so far, in registration order: `every` counts them
    for (size_t k = 0; k < modules.size(); ++k) {
        const auto& [fqn, m] = modules[k];
        if (!matches[k] || ++matched % spec.every != 0) continue;
        if (spec.mode != RecomputeMode::core_attn) {
            out.checkpointed.insert(m);
            if (spec.mode == RecomputeMode::op) out.selective.insert(m);
            continue;
        }
        std::vector<std::pair<Module*, AttentionCore*>> attention;
        attentions_under(*m, attention);
        if (attention.empty())
            warnings.push_back({spec.where,
                                fmt::format("activation_checkpointing mode core_attn: '{}' has "
                                            "no attention under it, nothing is recomputed",
                                            fqn),
                                DiagnosticKind::no_effect});
        for (const auto& [module, a] : attention) {
            if (a->flash())
                warnings.push_back({spec.where,
                                    fmt::format("activation_checkpointing mode core_attn: "
                                                "attention '{}' is flash, which recomputes its "
                                                "probabilities in backward already",
                                                module->fqn()),
                                    DiagnosticKind::no_effect});
            else
                out.recompute_core.insert(module);
        }
    }
    // op mode: a region's kept outputs are its own forward's; one checkpointed inside another would
    // recompute the inner within the outer's recompute, with the policy's count restarted. Walked
    // through every call site (a `shared` alias calls its module where the alias sits; the root
    // holds everything).
    if (spec.mode == RecomputeMode::op) {
        // each module's subtree once inside a region and once outside (aliases nested in aliases
        // would otherwise be walked once per path: exponentially many)
        std::set<std::pair<const Module*, bool>> walked;
        std::function<void(const Module&, const std::string&, const std::string*, int)> walk =
            [&](const Module& m, const std::string& fqn, const std::string* outer, int depth) {
                if (!walked.insert({&m, outer != nullptr}).second) return;
                const bool selected = out.selective.count(&m) > 0;
                if (selected && outer)
                    throw InputError(
                        spec.where,
                        fmt::format("activation_checkpointing mode op checkpoints '{}' inside '{}': nested "
                                    "regions under the op policy are not modelled (torchtitan checkpoints "
                                    "each block once); name one of them",
                                    fqn.empty() ? "(root)" : fqn, outer->empty() ? "(root)" : *outer));
                if (depth > 4096) return;  // (the loader refuses a module that holds itself)
                for (const auto& [name, child] : m.children())
                    walk(*child, fqn.empty() ? name : fqn + "." + name, selected ? &fqn : outer, depth + 1);
            };
        walk(*model.root, "", nullptr, 0);
    }
    for (size_t i = 0; i < spec.modules.size(); ++i)
        if (!found[i])
            warnings.push_back(
                {spec.where,
                 fmt::format("activation_checkpointing pattern '{}' matched no module", spec.modules[i]),
                 DiagnosticKind::unmatched_pattern});
    return out;
}

std::string ActivationCheckpointing::mode_of(const Module* m) const {
    if (selective.count(m)) return recompute_mode_name(RecomputeMode::op);
    if (checkpointed.count(m)) return recompute_mode_name(RecomputeMode::full);
    if (recompute_core.count(m)) return recompute_mode_name(RecomputeMode::core_attn);
    return "";
}

void ActivationCheckpointing::keep_only(const std::function<bool(const Module*)>& keep) {
    for (auto* set : {&checkpointed, &selective, &recompute_core})
        for (auto it = set->begin(); it != set->end();) it = keep(*it) ? std::next(it) : set->erase(it);
}

}  // namespace ptool
