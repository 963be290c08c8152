#include "train/stage.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "core/yaml_reader.h"
#include "train/schedule.h"

namespace ptool {
namespace {

// Whether a container only chains its children (its forward is theirs in order): a sequential or
// a repeat, but not a residual, nor a repeat's block (the unit a split point names).
bool opened(const Module& m, const Module& parent) {
    if (m.chaining() != Chaining::sequence && m.chaining() != Chaining::repeat) return false;
    return parent.chaining() != Chaining::repeat;
}

// The spine under m (named as m's children list them: a `shared` use by its own name); `blocks`
// collects its members that are a repeat's (the units layers_per_stage counts)
void walk(Module& m, const std::string& prefix, std::vector<Module*>& out, std::vector<std::string>* names,
          std::set<const Module*>* blocks = nullptr) {
    for (const auto& [name, child] : m.children()) {
        const std::string fqn = join_name(prefix, name);
        if (opened(*child, m)) {
            walk(*child, fqn, out, names, blocks);
        } else {
            out.push_back(child.get());
            if (names) names->push_back(fqn);
            if (blocks && m.chaining() == Chaining::repeat) blocks->insert(child.get());
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

// One module (a `shared` one, or a block holding one) used on stages of two pp ranks: each rank
// holds its own copy of its stages' modules (torch.distributed.pipelining's stage modules, torchtitan's
// pipeline_module_split), so the two uses would train two copies. InputError at `where`, naming both.
void check_one_rank_per_module(const std::vector<Module*>& spine, const std::vector<std::string>& names,
                               const std::vector<StageRange>& ranges, const std::vector<int>& placed,
                               const SourceLocation& where) {
    if (placed.empty() || *std::max_element(placed.begin(), placed.end()) == 0) return;  // one pp rank
    struct Use {
        size_t spine;
        int stage;
    };
    std::unordered_map<const Module*, Use> first;  // each module's first use, by spine member
    for (size_t s = 0; s < ranges.size(); ++s)
        for (size_t i = ranges[s].begin; i < ranges[s].end; ++i)
            for_each_module(*spine[i], [&](const std::string&, Module& m) {
                const auto [it, fresh] = first.try_emplace(&m, Use{i, static_cast<int>(s)});
                const Use u = it->second;
                const int was = placed[static_cast<size_t>(u.stage)], now = placed[s];
                if (fresh || was == now) return;
                const std::string what = &m == spine[i] && &m == spine[u.spine]
                                             ? "are one module"
                                             : fmt::format("hold one module, '{}'", m.fqn());
                throw InputError(
                    where,
                    fmt::format("'{}' (stage {}, pp rank {}) and '{}' (stage {}, pp rank {}) {} ({}), and "
                                "each pp rank trains its own copy of its stages' modules: put both uses on "
                                "stages of one pp rank (split_points), or give the second use its own "
                                "module, its weights tied to the first's with `tie:` (their gradients "
                                "summed over the stages, as Megatron's embedding group)",
                                names[u.spine], u.stage, was, names[i], s, now, what, m.where().str()));
            });
}

}  // namespace

std::vector<Module*> model_spine(const Model& model) {
    std::vector<Module*> out;
    walk(*model.root, "", out, nullptr);
    return out;
}

std::vector<std::string> spine_names(const Model& model) {
    std::vector<Module*> spine;
    std::vector<std::string> names;
    walk(*model.root, "", spine, &names);
    return names;
}

std::vector<StageRange> stage_ranges(const std::vector<std::string>& names,
                                     const std::vector<std::string>& split_points,
                                     const SourceLocation& where) {
    std::unordered_map<std::string, size_t> index;  // once: a lookup per split point, not a walk
    for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
    std::vector<StageRange> out{{0, names.size()}};
    for (const std::string& point : split_points) {
        const auto it = index.find(point);
        if (it == index.end())
            throw InputError(
                where,
                fmt::format("split point '{}' is not a module a stage can start at (the model's layers in "
                            "forward order: {}){}",
                            point, fmt::join(names, ", "), did_you_mean(point, names)));
        const size_t at = it->second;
        if (at <= out.back().begin)
            throw InputError(
                where,
                fmt::format("split point '{}' leaves stage {} empty: split points go in forward order, "
                            "each after the last",
                            point, out.size() - 1));
        out.back().end = at;
        out.push_back({at, names.size()});
    }
    return out;
}

std::vector<StageRange> pipeline_stage_ranges(const Model& model, const std::vector<Module*>& spine,
                                              const Plan& plan) {
    const PipelineSpec& spec = *plan.pipeline;
    const int stages = plan.pipeline_stages();
    std::vector<Module*> walked;
    std::vector<std::string> names;
    std::set<const Module*> members;
    walk(*model.root, "", walked, &names, &members);
    PTOOL_REQUIRE(walked == spine, "a spine of {} modules for a model of {}", spine.size(), walked.size());
    const std::vector<int> placed = stage_placement(spec.schedule, plan.dims.size(DimRole::pp), stages);
    if (!spec.split_points.empty()) {
        std::vector<StageRange> out = stage_ranges(names, spec.split_points, spec.split_where);
        check_one_rank_per_module(spine, names, out, placed, spec.split_where);
        return out;
    }
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
    for (int s = 1; s < stages; ++s) points.push_back(names[blocks[static_cast<size_t>(s * per)]]);
    std::vector<StageRange> out = stage_ranges(names, points, at);
    check_one_rank_per_module(spine, names, out, placed, at);
    return out;
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
    // (a split backward's I: at its W, after the work that writes the gradients it reduces)
    if (hooks)
        Module::defer_weights(ctx, [around](RunContext& c) { around->hooks()->post_backward(c, *around); });
    return d;
}

}  // namespace ptool
