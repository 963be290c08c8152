// The plan search's candidates (plan/search_state.h): dp x tp meshes and their data-parallel modes,
// HSDP and expert parallel, context parallel, pipelines, and the lint that refuses a mesh.
#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/parallel_for.h"
#include "plan/explain.h"
#include "plan/search_state.h"

namespace ptool::searching {

// A pipeline's microbatches a round: the most its rows per dp rank and round allow, a power of
// two times pp (the smallest bubble, the least held at once; microbatches of one row as
// torchtitan's default); 0 when they do not cut into pp.
int Search::pipeline_microbatches(const PlanChoice& c) const {
    const int64_t per_round = rows_ / c.dp / std::max<int64_t>(1, full_.gradient_accumulation);
    if (per_round % c.pp) return 0;
    int m = c.pp;
    while (per_round % (2 * m) == 0) m *= 2;
    return m;
}

// Whether the batch's rows split over dp; where not, the candidate `shape` is rejected so.
bool Search::rows_split(int dp, const std::string& shape) {
    if (rows_ % dp == 0) return true;
    r_.rejected.push_back({shape, fmt::format("the batch's {} rows do not split over dp={}", rows_, dp),
                           RejectionKind::indivisible});
    return false;
}

// Why the experts do not split over ep ranks ("" when every moe layer's do).
std::string Search::expert_split(int ep) const {
    for (const auto& [fqn, experts] : experts_)
        if (experts % ep)
            return fmt::format("expert parallel: moe '{}' has {} experts, which do not divide over ep={}",
                               fqn, experts, ep);
    return "";
}

// The dp x tp meshes the lint accepts, each with its modes and checkpointing; the rest rejected.
std::vector<PlanChoice> Search::meshes() {
    lint_ahead();
    std::vector<PlanChoice> groups;
    for (int tp = 1; tp <= r_.world_size; ++tp) {
        if (r_.world_size % tp) continue;
        const int dp = r_.world_size / tp;
        const std::string mesh = fmt::format("dp={} x tp={}", dp, tp);
        if (tp > 1 && !tpl_.tp.unsupported.empty()) {
            r_.rejected.push_back({fmt::format("tp={}", tp),
                                   "no tensor-parallel plan: " + tpl_.tp.unsupported,
                                   RejectionKind::topology});
            continue;
        }
        if (tp > cluster_.gpus_per_node || cluster_.gpus_per_node % tp) {
            r_.rejected.push_back(
                {fmt::format("tp={}", tp),
                 fmt::format("crosses a node of {} GPUs (tensor parallelism's collectives block the compute: "
                             "NVLink only)",
                             cluster_.gpus_per_node),
                 RejectionKind::topology});
            continue;
        }
        PlanChoice tp_only;
        tp_only.tp = tp, tp_only.param_dtype = o_.param_dtype;
        add_pipelines(tp_only, groups);
        add_context_parallel(tp_only, groups);
        if (!rows_split(dp, mesh)) continue;
        PlanChoice base;
        base.dp = dp, base.tp = tp, base.param_dtype = o_.param_dtype;
        if (std::string why = lint(base); !why.empty()) {
            r_.rejected.push_back({mesh, why, RejectionKind::refused});
            continue;
        }
        // HSDP, as torchtitan's dp_replicate x dp_shard: fully_shard over the dp ranks of a node,
        // replicated across nodes (the reduce_scatter stays on NVLink; a 1/shard part of the
        // gradients is all_reduced between nodes), where dp spans more than one node's
        const int node_shard = cluster_.gpus_per_node / tp;
        const bool hsdp = node_shard > 1 && dp > node_shard && dp % node_shard == 0;
        for (const auto& [mode, over_nodes] : kDataParallelShapes) {
            if (dp == 1 && mode == DataParallelMode::replicate) continue;  // one rank: nothing to choose
            if (over_nodes && !hsdp) continue;
            for (const auto& [ckpt, op] : kCheckpointing) {
                if (ckpt && tpl_.blocks.empty()) continue;
                PlanChoice c = base;
                c.dp_mode = mode, c.checkpoint = ckpt, c.selective = op;
                if (over_nodes) c.dp_shard = node_shard;
                groups.push_back(c);
                // expert parallel over the dp dim where every layer's experts divide over it
                // (torchtitan borrows ep from the data-parallel ranks); under HSDP over dp_shard
                // (each rank's experts whole, the all_to_all inside a node), or over dp_replicate
                // with each rank's experts sharded over dp_shard, dp_replicate the outer dim (the
                // all_to_all across nodes) or the inner one (fully_shard's across nodes)
                for (const int variant : {0, 1, 2}) {
                    if (variant > 0 && !c.hybrid()) continue;
                    const int ep = !c.hybrid() ? c.dp : variant > 0 ? c.dp_replicate() : c.dp_shard;
                    if (experts_.empty() || ep <= 1) continue;
                    PlanChoice e = c;
                    e.ep = ep, e.ep_replicate = variant > 0, e.ep_inner = variant == 2;
                    if (std::string why = expert_split(ep); !why.empty()) {
                        if (!ckpt && variant < 2)
                            r_.rejected.push_back(
                                {fmt::format("{} {}", mesh, e.mode_name()), why, RejectionKind::indivisible});
                    } else {
                        groups.push_back(e);
                    }
                }
                // ZeRO-1 and ZeRO-2 (parallel/zero_optimizer.h): replicate's communication
                // with the optimizer state (and gradients) sharded over dp
                if (mode == DataParallelMode::replicate)
                    for (int stage : {1, 2}) groups.push_back(c), groups.back().zero_stage = stage;
            }
        }
    }
    return with_float8(std::move(groups));
}

// The groups as SearchOptions::float8 asks: each with the recipe, or (offer) each without and then
// with tensorwise, simulated apart (the casts, the float8 all-gather and its unsharded weights change
// both the time and the memory).
std::vector<PlanChoice> Search::with_float8(std::vector<PlanChoice> groups) const {
    if (o_.float8 == Float8Search::never) return groups;
    const bool offer = o_.float8 == Float8Search::offer;
    std::vector<PlanChoice> out;
    for (PlanChoice& c : groups) {
        if (offer) out.push_back(c);
        out.push_back(std::move(c));
        out.back().float8 =
            o_.float8 == Float8Search::rowwise ? Float8Scaling::rowwise : Float8Scaling::tensorwise;
    }
    return out;
}

// Context parallel over the tp of `base` (its tp accepted): cp a power of two with cp x tp
// within a node (the attention's key/value collectives block the compute: NVLink only, as tp's),
// the sequence in 2 x cp chunks (load-balanced), dp the rest; fully_shard over dp x cp (as
// torchtitan composes them), checkpointing or not.
void Search::add_context_parallel(const PlanChoice& base, std::vector<PlanChoice>& groups) {
    const Shape& in = full_.input.shape;
    if (in.size() < (full_.input.ids ? 2u : 3u)) return;  // no sequence dim
    for (int cp = 2; cp * base.tp <= cluster_.gpus_per_node && r_.world_size % (cp * base.tp) == 0; cp *= 2) {
        const int dp = r_.world_size / base.tp / cp;
        const std::string shape = fmt::format("dp={} x cp={} x tp={}", dp, cp, base.tp);
        if (in[1] % (2 * cp) != 0) {
            r_.rejected.push_back(
                {shape, fmt::format("the sequence of {} does not cut into {} chunks (2 x cp)", in[1], 2 * cp),
                 RejectionKind::indivisible});
            continue;
        }
        if (!rows_split(dp, shape)) continue;
        PlanChoice c = base;
        c.dp = dp, c.cp = cp;
        if (std::string why = lint(c); !why.empty()) {
            r_.rejected.push_back({shape, why, RejectionKind::refused});
            continue;
        }
        for (const auto& [ckpt, op] : kCheckpointing) {
            if (ckpt && tpl_.blocks.empty()) continue;
            c.dp_mode = DataParallelMode::fully_shard, c.checkpoint = ckpt, c.selective = op;
            groups.push_back(c);
        }
    }
}

// Pipelines over the tp of `base` (its tp and lint accepted): pp ranks outermost, pp a power of
// two dividing world / tp with at least one block per stage, dp the rest; fully_shard or
// replicate inside each stage, checkpointing or not, 1F1B, interleaved 1F1B (v 2), zero_bubble, and
// zbv and dualpipev (the V, up to kMostVRanks pp ranks).
void Search::add_pipelines(const PlanChoice& base, std::vector<PlanChoice>& groups) {
    if (!extrapolate_) return;  // a stage's costs are extrapolated over the blocks of one long repeat
    for (int pp = 2; pp <= r_.world_size / base.tp && pp <= layers_; pp *= 2) {
        if ((r_.world_size / base.tp) % pp) break;
        const int dp = r_.world_size / base.tp / pp;
        for (const auto& [schedule, v] : kPipelineShapes) {
            const std::string shape =
                fmt::format("pp={} x dp={} x tp={} {}", pp, dp, base.tp, schedule_kind_name(schedule));
            if (layers_ < pp * v) {
                r_.rejected.push_back({shape, fmt::format("{} blocks < {} stages", layers_, pp * v),
                                       RejectionKind::indivisible});
                continue;
            }
            if (!rows_split(dp, shape)) continue;
            if (v_placed(schedule) && pp > kMostVRanks) {
                r_.rejected.push_back(
                    {shape,
                     fmt::format("the V placement is searched up to {} pp ranks (its samples "
                                 "are not widened)",
                                 kMostVRanks),
                     RejectionKind::unsampled});
                continue;
            }
            const int64_t per_round = rows_ / dp / std::max<int64_t>(1, full_.gradient_accumulation);
            if (per_round < pp) {
                r_.rejected.push_back(
                    {shape,
                     fmt::format("{} microbatches < {} stages (the batch's {} rows over dp={}, {} round{})",
                                 per_round, pp, rows_, dp, full_.gradient_accumulation,
                                 full_.gradient_accumulation == 1 ? "" : "s"),
                     RejectionKind::indivisible});
                continue;
            }
            for (const DataParallelMode mode : {DataParallelMode::fully_shard, DataParallelMode::replicate}) {
                if (dp == 1 && mode == DataParallelMode::replicate) continue;
                for (const auto& [ckpt, op] : kCheckpointing) {
                    if (ckpt && tpl_.blocks.empty()) continue;
                    PlanChoice c = base;
                    c.dp = dp, c.pp = pp, c.schedule = schedule, c.virtual_stages = v, c.repeat = repeat_;
                    c.dp_mode = mode, c.checkpoint = ckpt, c.selective = op;
                    groups.push_back(c);
                }
            }
        }
    }
}

// The meshes meshes() and add_context_parallel lint: each tp within a node (and a tp plan where tp
// > 1) with its dp, and its context-parallel meshes, where the batch's rows (and the sequence) split.
void Search::lint_ahead() {
    std::vector<PlanChoice> meshes;
    const Shape& in = full_.input.shape;
    const bool sequence = in.size() >= (full_.input.ids ? 2u : 3u);
    for (int tp = 1; tp <= r_.world_size && tp <= cluster_.gpus_per_node; ++tp) {
        if (r_.world_size % tp || cluster_.gpus_per_node % tp || (tp > 1 && !tpl_.tp.unsupported.empty()))
            continue;
        for (int cp = 1; cp == 1 || (sequence && cp * tp <= cluster_.gpus_per_node &&
                                     r_.world_size % (cp * tp) == 0 && in[1] % (2 * cp) == 0);
             cp *= 2) {
            PlanChoice c;
            c.dp = r_.world_size / tp / cp, c.cp = cp, c.tp = tp, c.param_dtype = o_.param_dtype;
            if (rows_ % c.dp == 0) meshes.push_back(c);
        }
    }
    std::vector<std::string> why(meshes.size());
    parallel_for(meshes.size(), o_.threads, [&](size_t i) { why[i] = lint(meshes[i]); });
    for (size_t i = 0; i < meshes.size(); ++i)
        linted_[{meshes[i].dp, meshes[i].cp, meshes[i].tp}] = std::move(why[i]);
}

// Why explain's rules refuse the mesh ("" if they do not): uneven shards (heads, features,
// vocab, sequence), a conflict, or a plan that changes what is computed.
std::string Search::lint(PlanChoice c) const {
    if (auto it = linted_.find({c.dp, c.cp, c.tp}); it != linted_.end()) return it->second;
    c.dp_mode = DataParallelMode::fully_shard;
    try {
        const Explanation ex = explain_plan(full_, load_emitted_plan(write_plan(tpl_, c), "generated.yaml"));
        for (const Diagnostic& w : ex.resolution.warnings)
            if (w.kind == DiagnosticKind::uneven_shard) return w.message;
        if (!ex.resolution.causes.empty()) return ex.resolution.causes.front().message;
    } catch (const InputError& e) {
        return e.message();
    }
    return "";
}

}  // namespace ptool::searching
