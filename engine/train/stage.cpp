#include "train/stage.h"

#include <set>

#include "core/yaml_reader.h"

namespace ptool {
namespace {

// Whether a container only chains its children (its forward is theirs in order): a sequential or
// a repeat, but not a residual, nor a repeat's block (the unit a split point names).
bool opened(const Module& m, const Module& parent) {
    if (!dynamic_cast<const Sequential*>(&m) || dynamic_cast<const Residual*>(&m)) return false;
    return !dynamic_cast<const Repeat*>(&parent);
}

// The spine under m; `blocks` collects its members that are a repeat's (the units layers_per_stage counts)
void walk(Module& m, std::vector<Module*>& out, std::set<const Module*>* blocks = nullptr) {
    for (const auto& [name, child] : m.children()) {
        if (opened(*child, m)) {
            walk(*child, out, blocks);
        } else {
            out.push_back(child.get());
            if (blocks && dynamic_cast<const Repeat*>(&m)) blocks->insert(child.get());
        }
    }
}

// Keeps, under an opened container, the children that are kept modules or contain one.
bool prune(Module& m, const std::set<const Module*>& kept) {
    if (kept.count(&m)) return true;
    bool any = false;
    m.keep_children([&](Module& child) {
        const bool keep = (opened(child, m) || kept.count(&child)) && prune(child, kept);
        any = any || keep;
        return keep;
    });
    return any;
}

}  // namespace

std::vector<Module*> model_spine(const Model& model) {
    std::vector<Module*> out;
    walk(*model.root, out);
    return out;
}

std::vector<StageRange> stage_ranges(const std::vector<Module*>& spine,
                                     const std::vector<std::string>& split_points,
                                     const SourceLocation& where) {
    std::vector<StageRange> out{{0, spine.size()}};
    for (const std::string& point : split_points) {
        size_t at = spine.size();
        for (size_t i = 0; i < spine.size(); ++i)
            if (spine[i]->fqn() == point) at = i;
        if (at == spine.size()) {
            std::vector<std::string> names;
            for (const Module* m : spine) names.push_back(m->fqn());
            throw InputError(
                where,
                fmt::format("split point '{}' is not a module a stage can start at (the model's layers in "
                            "forward order: {}){}",
                            point, fmt::join(names, ", "), did_you_mean(point, names)));
        }
        if (at <= out.back().begin)
            throw InputError(
                where,
                fmt::format("split point '{}' leaves stage {} empty: split points go in forward order, "
                            "each after the last",
                            point, out.size() - 1));
        out.back().end = at;
        out.push_back({at, spine.size()});
    }
    return out;
}

std::vector<StageRange> pipeline_stage_ranges(const Model& model, const std::vector<Module*>& spine,
                                              const Plan& plan) {
    const PipelineSpec& spec = *plan.pipeline;
    const int stages = plan.pipeline_stages();
    if (!spec.split_points.empty()) return stage_ranges(spine, spec.split_points, spec.split_where);
    std::set<const Module*> members;
    std::vector<Module*> walked;
    walk(*model.root, walked, &members);
    std::vector<size_t> blocks;  // the spine's indices of a repeat's members
    for (size_t i = 0; i < spine.size(); ++i)
        if (members.count(spine[i])) blocks.push_back(i);
    const SourceLocation& at = spec.layers_per_stage > 0 ? spec.split_where : spec.where;
    if (blocks.empty())
        throw InputError(at,
                         "the model has no repeated blocks to cut into stages: name the modules that start "
                         "stages 1.. in 'split_points'");
    const int64_t n = static_cast<int64_t>(blocks.size());
    const int64_t per = spec.layers_per_stage > 0 ? spec.layers_per_stage : n / stages;
    if (per * stages != n)
        throw InputError(
            at, spec.layers_per_stage > 0
                    ? fmt::format("layers_per_stage {} x {} stages is {} blocks, but the model has {}: give "
                                  "split_points for uneven stages",
                                  per, stages, per * stages, n)
                    : fmt::format("the model's {} blocks do not divide evenly over {} stages: give "
                                  "'layers_per_stage' or 'split_points'",
                                  n, stages));
    std::vector<std::string> points;
    for (int s = 1; s < stages; ++s) points.push_back(spine[blocks[static_cast<size_t>(s * per)]]->fqn());
    return stage_ranges(spine, points, at);
}

void keep_stages(Model& model, const std::vector<Module*>& spine, const std::vector<StageRange>& stages) {
    std::set<const Module*> kept;
    for (const StageRange& r : stages)
        kept.insert(spine.begin() + static_cast<std::ptrdiff_t>(r.begin),
                    spine.begin() + static_cast<std::ptrdiff_t>(r.end));
    prune(*model.root, kept);
}

Placed stage_forward(RunContext& ctx, const std::vector<Module*>& modules, const Placed& x, Module* around) {
    const ModuleHooks* hooks = around ? around->hooks().get() : nullptr;
    Placed h = hooks ? around->hooks()->pre_forward(ctx, *around, x) : x;
    for (Module* m : modules) h = m->forward(ctx, h);
    return hooks ? around->hooks()->post_forward(ctx, *around, h) : h;
}

Placed stage_backward(RunContext& ctx, const std::vector<Module*>& modules, const Placed& dy,
                      Module* around) {
    const ModuleHooks* hooks = around ? around->hooks().get() : nullptr;
    Placed d = hooks ? around->hooks()->post_forward_backward(ctx, *around, dy) : dy;
    for (auto it = modules.rbegin(); it != modules.rend(); ++it) d = (*it)->backward(ctx, d);
    if (hooks && d.defined()) d = around->hooks()->pre_forward_backward(ctx, *around, d);
    if (hooks) around->hooks()->post_backward(ctx, *around);
    return d;
}

}  // namespace ptool
