#include "plan/plan_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "core/fqn_pattern.h"
#include "core/yaml_writer.h"
#include "model/module_type.h"
#include "parallel/style_names.h"

namespace ptool {
namespace {

using namespace style_name;

enum class Act { replicate, sequence, features };

// What the module's type says the writer does with it (model/module_type.h).
TpRule rule_of(const Module& m) {
    return m.module_type().tp_template().rule;
}

struct Writer {
    TensorParallelTemplate out;
    bool has_sequence = false;     // token input: sequence parallel
    const Module* last = nullptr;  // the last module with parameters in forward order: the head
    std::map<const Module*, Act> seen;

    void fail(const Module& m, const std::string& why) {
        if (out.unsupported.empty()) out.unsupported = fmt::format("{} '{}': {}", m.type(), m.fqn(), why);
    }
    void add(const std::string& pattern, const std::string& style) {
        out.entries.push_back({pattern, style});
    }

    Act visit(const Module& m, const std::string& pattern, Act a) {
        if (!out.unsupported.empty()) return a;
        if (auto it = seen.find(&m); it != seen.end()) {  // a shared module runs again: as it ran
            if (it->second != a) fail(m, "reused on another layout");
            return transfer(m, a);
        }
        seen[&m] = a;
        const TpTemplate tpl = m.module_type().tp_template();
        switch (tpl.rule) {
            case TpRule::sequence:
            case TpRule::repeat:
            case TpRule::residual: {
                const bool repeat = tpl.rule == TpRule::repeat;
                Act cur = a;
                bool first = true;
                for (const auto& [name, child] : m.children()) {
                    if (repeat && !first) break;  // every element is the first's copy
                    first = false;
                    const std::string p =
                        join_name(pattern, repeat ? std::string("*") : fqn_escape(name));  // transparent: ""
                    const Act before = cur;
                    cur = visit(*child, p, cur);
                    if (repeat && cur != before) fail(m, "an element ends in another layout than it starts");
                }
                if (tpl.rule == TpRule::residual && cur != a)
                    fail(m, "its body ends in another layout than its input (the sum needs one)");
                return cur;
            }
            case TpRule::embedding:
                if (a != Act::replicate) return fail(m, "its ids are not replicated"), a;
                add(pattern,
                    entry(rowwise, has_sequence ? "input_layouts: replicate, output_layouts: shard(1)"
                                                : "input_layouts: replicate"));
                return has_sequence ? Act::sequence : Act::replicate;
            case TpRule::norm:
                if (a == Act::features) fail(m, "normalises over features a colwise linear split");
                if (a == Act::sequence) add(pattern, entry(sequence_parallel));
                return a;
            case TpRule::whole:  // positions are rows of its weight: whole sequences only
                if (a != Act::replicate) fail(m, "needs whole sequences and features");
                return a;
            case TpRule::elementwise:
                return a;
            case TpRule::projections:
                if (a == Act::features) return fail(m, "its input is split over features"), a;
                if (a == Act::sequence)
                    add(pattern,
                        entry(prepare_input, "input_layouts: shard(1), desired_input_layouts: replicate"));
                add(pattern + tpl.colwise, entry(colwise));
                add(pattern + tpl.rowwise,
                    entry(rowwise, a == Act::sequence ? "output_layouts: shard(1)" : ""));
                return a;
            case TpRule::experts: {  // each expert, and a shared one, as projections on whole tokens
                if (a == Act::features) return fail(m, "its input is split over features"), a;
                if (a == Act::sequence)
                    add(pattern, entry(prepare_input_output,
                                       "input_layouts: shard(1), desired_input_layouts: replicate, "
                                       "output_layouts: replicate, desired_output_layouts: shard(1)"));
                std::vector<std::string> blocks = {".experts.*"};
                for (const auto& [name, child] : m.children())
                    if (name == "shared_expert") blocks.push_back(".shared_expert");
                for (const std::string& b : blocks) {
                    add(pattern + b + tpl.colwise, entry(colwise));
                    add(pattern + b + tpl.rowwise, entry(rowwise));
                }
                return a;
            }
            case TpRule::linear:
                if (&m == last && a == Act::features) {  // the second of a Megatron pair ends the model
                    add(pattern, entry(rowwise));
                    out.loss_parallel = false;
                    return Act::replicate;
                }
                if (&m == last) {
                    const std::string in = a == Act::sequence ? "input_layouts: shard(1), " : "";
                    add(pattern,
                        entry(colwise,
                              in + (out.loss_parallel ? "output_layouts: shard(-1), use_local_output: false"
                                                      : "output_layouts: replicate")));
                    return Act::replicate;
                }
                if (a == Act::features) {
                    add(pattern, entry(rowwise, has_sequence ? "output_layouts: shard(1)" : ""));
                    return has_sequence ? Act::sequence : Act::replicate;
                }
                add(pattern, entry(colwise, a == Act::sequence ? "input_layouts: shard(1)" : ""));
                return Act::features;
            case TpRule::none:
                break;
        }
        fail(m, "no tensor-parallel rule for this module type");
        return a;
    }

    // A shared module's second run: the layout it leaves (its entries are written).
    Act transfer(const Module& m, Act a) {
        const TpRule rule = rule_of(m);
        if (rule == TpRule::embedding) return has_sequence ? Act::sequence : Act::replicate;
        if (rule == TpRule::linear)
            return &m == last           ? Act::replicate
                   : a == Act::features ? (has_sequence ? Act::sequence : Act::replicate)
                                        : Act::features;
        return a;
    }
};

void find_last(const Module& m, const Module*& last) {
    if (rule_of(m) == TpRule::linear) last = &m;
    if (rule_of(m) == TpRule::projections || rule_of(m) == TpRule::experts)
        last = &m;  // its linears are its own
    else
        for (const auto& [name, child] : m.children()) find_last(*child, last);
}

bool has_batch_norm(const Module& m) {
    if (m.batch_statistics()) return true;
    for (const auto& [name, child] : m.children())
        if (has_batch_norm(*child)) return true;
    return false;
}

}  // namespace

TensorParallelTemplate tensor_parallel_template(const Model& model) {
    Writer w;
    const Module* first = model.root.get();
    while (!first->children().empty()) first = first->children().front().second.get();
    bool positions = false;  // GPT-2's wpe adds positions to whole sequences: the writer then plans no
                             // sequence parallelism
    for_each_module(*model.root,
                    [&](const std::string&, Module& m) { positions |= rule_of(m) == TpRule::whole; });
    w.has_sequence = model.input.ids && model.input.shape.size() == 2 &&
                     rule_of(*first) == TpRule::embedding && !positions;
    w.out.sequence_parallel = w.has_sequence;
    find_last(*model.root, w.last);
    if (w.last && rule_of(*w.last) != TpRule::linear) w.last = nullptr;
    w.out.loss_parallel = model.loss == LossKind::cross_entropy && w.last;
    w.visit(*model.root, "", Act::replicate);
    if (w.out.entries.empty() && w.out.unsupported.empty()) w.out.unsupported = "no module to split";
    return w.out;
}

// A repeat's blocks, where each holds its own weights: a weight of a block also reached under a
// name outside it (a `shared` module called elsewhere) would be sharded by the block's fully_shard
// unit and computed on outside it (refused: parallel/data_parallel.h, check_tied_units).
std::vector<std::string> repeated_blocks(const Model& model) {
    std::map<const Parameter*, std::vector<std::string>> names;  // every name of every weight
    for_each_param(*model.root,
                   [&](const std::string& n, const ParamPtr& p) { names[p.get()].push_back(n); });
    auto self_contained = [&](const std::string& repeat) {  // (its raw FQN)
        const std::string prefix = repeat.empty() ? "" : repeat + ".";
        for (const auto& [param, list] : names)
            for (const std::string& a : list) {
                if (a.rfind(prefix, 0) != 0) continue;
                const std::string block = a.substr(0, a.find('.', prefix.size()));  // repeat.i
                for (const std::string& b : list)
                    if (b.rfind(block + ".", 0) != 0) return false;
            }
        return true;
    };
    std::vector<std::string> out;
    std::function<void(const Module&, const std::string&, const std::string&)> walk =
        [&](const Module& m, const std::string& p, const std::string& raw) {
            if (m.chaining() == Chaining::repeat) {
                if (self_contained(raw)) out.push_back(p.empty() ? "*" : p + ".*");
                return;
            }
            for (const auto& [name, child] : m.children())
                walk(*child, join_name(p, fqn_escape(name)), join_name(raw, name));
        };
    walk(*model.root, "", "");
    return out;
}

PlanTemplate plan_template(const Model& model) {
    return {tensor_parallel_template(model), repeated_blocks(model), has_batch_norm(*model.root),
            model.dtype};
}

std::string write_plan(const PlanTemplate& model, const PlanChoice& c) {
    const TensorParallelTemplate& tp = model.tp;
    std::string s;
    std::vector<std::string> dims;
    if (c.pp > 1) dims.push_back(fmt::format("pp: {}", c.pp));      // outermost: the dim that crosses nodes
    const bool dp_section = c.dp > 1 || c.param_dtype || c.cp > 1;  // fully_shard over dp x cp
    if (dp_section && c.hybrid() && c.ep > 1 && c.ep_replicate && c.ep_inner)  // ep (dp_replicate) inner: the
        // blocking all_to_all inside a node, the experts' fully_shard over dp_shard across nodes, as
        // torchtitan's dp_shard_mod_ep (outer) x dp_shard_in_ep (inner)
        dims.push_back(fmt::format("dp_shard: {}, dp_replicate: {}", c.dp_shard, c.dp_replicate()));
    else if (dp_section && c.hybrid())
        dims.push_back(fmt::format("dp_replicate: {}, dp_shard: {}", c.dp_replicate(), c.dp_shard));
    else if (dp_section)
        dims.push_back(fmt::format("dp: {}", c.dp));
    if (c.cp > 1) dims.push_back(fmt::format("cp: {}", c.cp));  // torchtitan's order: dp, cp, tp
    if (c.tp > 1) dims.push_back(fmt::format("tp: {}", c.tp));
    if (dims.empty()) dims.push_back("world: 1");
    s += fmt::format("mesh: {{{}}}\n", fmt::join(dims, ", "));
    if (c.gradient_accumulation > 0)  // the training layout: over the model's (docs/plan_format.md)
        s += fmt::format("gradient_accumulation: {}\n", c.gradient_accumulation);
    auto list = [](const std::vector<std::string>& v) {
        std::vector<std::string> q;
        for (const auto& x : v) q.push_back(yaml_quoted(x));  // module names come from the model file
        return fmt::format("[{}]", fmt::join(q, ", "));
    };
    if (c.tp > 1) {
        s += "tensor_parallel:\n  mesh_dim: tp\n";
        if (tp.loss_parallel) s += "  loss_parallel: true\n";
        s += "  plan:\n";
        for (const auto& [pattern, style] : tp.entries)
            s += fmt::format("    {}: {}\n", yaml_quoted(pattern), style);
    }
    const std::vector<std::string>& blocks = model.blocks;
    if (dp_section) {
        s += fmt::format("data_parallel:\n  mesh_dim: {}\n  mode: {}\n",
                         c.hybrid() ? "[dp_replicate, dp_shard]" : "dp", data_parallel_mode_name(c.dp_mode));
        if (c.dp_mode == DataParallelMode::fully_shard) s += fmt::format("  fully_shard: {}\n", list(blocks));
        if (c.dp_mode == DataParallelMode::replicate && c.zero_stage > 0)
            s += fmt::format("  zero_stage: {}\n", c.zero_stage);
        if (model.batch_norm) s += "  sync_batch_norm: true\n";  // the reference's statistics
        if (c.param_dtype)
            s += fmt::format("  mixed_precision: {{param_dtype: {}, reduce_dtype: {}}}\n", *c.param_dtype,
                             dtype_name(model.dtype));
    }
    if (c.ep > 1 && dp_section)  // the experts over the dp ranks (HSDP's shard dim), as torchtitan borrows ep
        s += fmt::format("expert_parallel:\n  mesh_dim: {}\n", c.ep_mesh_dim());
    if (c.cp > 1) s += "context_parallel:\n  mesh_dim: cp\n";  // allgather, load-balanced: the defaults
    if (c.checkpoint && !blocks.empty())
        s += c.selective ? fmt::format("activation_checkpointing: {{modules: {}, mode: op}}\n", list(blocks))
                         : fmt::format("activation_checkpointing: {}\n", list(blocks));
    if (c.pp > 1) {
        s += fmt::format("pipeline_parallel:\n  mesh_dim: pp\n  schedule: {}\n",
                         schedule_kind_name(c.schedule));
        if (c.virtual_stages > 1) s += fmt::format("  virtual_stages: {}\n", c.virtual_stages);
        if (c.pp_microbatches > 0) s += fmt::format("  microbatches: {}\n", c.pp_microbatches);
        const bool even =
            c.stage_blocks.empty() || std::all_of(c.stage_blocks.begin(), c.stage_blocks.end(),
                                                  [&](int n) { return n == c.stage_blocks.front(); });
        if (even && !c.stage_blocks.empty()) {
            s += fmt::format("  layers_per_stage: {}\n", c.stage_blocks.front());
        } else if (!even) {  // the blocks that start stages 1..
            std::vector<std::string> splits;
            int at = 0;
            for (size_t k = 0; k + 1 < c.stage_blocks.size(); ++k)
                splits.push_back(join_name(c.repeat, std::to_string(at += c.stage_blocks[k])));
            s += fmt::format("  split_points: {}\n", list(splits));
        }
    }
    if (c.float8) {  // torchtitan's float8 converter: no filter_fqns, the head left out
        s += fmt::format("float8:\n  recipe: {}\n", float8_scaling_name(*c.float8));
        if (c.float8_all_gather())
            s += "  enable_fsdp_float8_all_gather: true\n  precompute_float8_dynamic_scale_for_fsdp: true\n";
        s += "compile: true\n";  // torchtitan's float8 pays under torch.compile (the casts fused)
    }
    return s;
}

}  // namespace ptool
