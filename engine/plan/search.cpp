#include "plan/search.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/parallel_for.h"
#include "model/moe.h"
#include "plan/device_overheads.h"
#include "plan/explain.h"
#include "plan/pipeline_search.h"
#include "plan/shrink.h"
#include "train/simulate.h"

namespace ptool {
namespace {

std::string gib(double bytes) {
    return fmt::format("{:.1f} GiB", bytes / (1ull << 30));
}

struct Simulated {
    RankMemory memory;
    MetaWork work;
    CommByOpDim comm;
    std::map<std::string, int64_t> phases;  // peak per module pass, the blocks' named first/last
};

// "layers.2.attn_block/b" of a repeat "layers" of `count` blocks -> "layers.last.attn_block/b";
// block 0 -> "first"; a block between them -> "" (its peaks are below the last's: fewer saved).
std::string block_phase(const std::string& label, const std::string& repeat, int64_t count) {
    if (label.rfind(repeat + ".", 0) != 0) return label;
    const size_t start = repeat.size() + 1, end = label.find_first_of("./", start);
    const int64_t index = std::stoll(label.substr(start, end - start));
    const std::string rest = end == std::string::npos ? "" : label.substr(end);
    if (index == 0) return repeat + ".first" + rest;
    if (index == count - 1) return repeat + ".last" + rest;
    return "";
}

Simulated simulate(const std::string& model_text, const std::string& name, const Plan& plan,
                   const std::string& repeat = "", int64_t count = 0) {
    RunInputs in;
    in.model_path = name;
    in.model_text = model_text;
    RankSimulation s = simulate_rank(in, plan, 0, 2, !repeat.empty());
    Simulated out{s.memory, s.step_work, by_op_dim(s.step_comm), {}};
    for (const auto& [label, peak] : s.phase_peaks)
        if (std::string key = block_phase(label, repeat, count); !key.empty())
            out.phases[key] = std::max(out.phases[key], peak);
    return out;
}

// a + (b - a) * k, field by field: memory and work that grow by one block per step from a to b. The
// peak is the largest of the phases' peaks extrapolated each on its own: which phase peaks can
// change with the number of blocks (the loss's buffers with few, the last block's backward with many).
Simulated extrapolate(const Simulated& a, const Simulated& b, double k) {
    auto lin = [k](double x, double y) { return x + (y - x) * k; };
    Simulated o;
    o.memory.peak = static_cast<int64_t>(lin(a.memory.peak, b.memory.peak));
    for (const auto& [key, pa] : a.phases)
        if (auto it = b.phases.find(key); it != b.phases.end())
            o.memory.peak = std::max(o.memory.peak, static_cast<int64_t>(lin(pa, it->second)));
    // the caching allocator's excess over the peak does not grow with the blocks (it is the largest
    // transients' segments and the holes between them): the samples' largest, over the extrapolated peak
    o.memory.reserved_peak = o.memory.peak + std::max({int64_t{0}, a.memory.reserved_peak - a.memory.peak,
                                                       b.memory.reserved_peak - b.memory.peak});
    o.memory.resident = static_cast<int64_t>(lin(a.memory.resident, b.memory.resident));
    for (int u = 0; u < kMemoryUses; ++u)
        o.memory.at_peak[u] = static_cast<int64_t>(lin(a.memory.at_peak[u], b.memory.at_peak[u]));
    o.work.gemm_flops = lin(a.work.gemm_flops, b.work.gemm_flops);
    o.work.recompute_flops = lin(a.work.recompute_flops, b.work.recompute_flops);
    o.work.memory_bytes = lin(a.work.memory_bytes, b.work.memory_bytes);
    o.work.kernels = static_cast<int64_t>(lin(a.work.kernels, b.work.kernels));
    o.comm = comm_extrapolated(a.comm, b.comm, k);
    return o;
}

}  // namespace

namespace {

// What one search knows about the model, and its two stages: the meshes (the lint, once per
// dp x tp) and each (mesh, mode, checkpointing) group's microbatches until one fits.
class Search {
public:
    Search(const std::string& model_text, const std::string& name, const Cluster& cluster,
           const SearchOptions& o)
        : text_(model_text), name_(name), cluster_(cluster), o_(o), full_(load_meta(model_text, name)) {
        r_.world_size = o.world_size > 0 ? o.world_size : cluster.world_size();
        r_.memory_cap = o.memory_cap > 0 ? o.memory_cap : cluster.memory_bytes - cluster.reserved_bytes;
        r_.compute = o.param_dtype ? parse_dtype(*o.param_dtype) : full_.dtype;
        if (r_.world_size > cluster.world_size())
            throw InputError(fmt::format("--world-size {} is more than {}'s {} GPUs", r_.world_size,
                                         cluster.name, cluster.world_size()));
        tpl_ = tensor_parallel_template(full_);
        r_.tp_unsupported = tpl_.unsupported;
        blocks_ = repeated_blocks(full_);
        for (const auto& [fqn, m] : named_modules(*full_.root))
            if (const auto* moe = dynamic_cast<const Moe*>(m))
                experts_.emplace_back(fqn, moe->options().router.experts);
        int long_repeats = 0;
        int64_t block_params = 0;  // the largest repeat element's parameter elements
        for_each_module(*full_.root, [&](const std::string& fqn, Module& m) {
            if (!dynamic_cast<const Repeat*>(&m) || m.children().empty()) return;
            int64_t n = 0;
            for_each_param(*m.children().front().second,
                           [&](const std::string&, const ParamPtr& p) { n += p->value.numel(); });
            block_params = std::max(block_params, n);
            if (m.children().size() >= 4)
                ++long_repeats, layers_ = static_cast<int64_t>(m.children().size()), repeat_ = fqn;
        });
        extrapolate_ = long_repeats == 1;
        block_unsharded_ = static_cast<double>(block_params) * dtype_size(r_.compute);
        rows_ = full_.input.shape.at(0);
    }

    // The dp x tp groups first, then the pipelines that could still rank among the o_.keep fastest:
    // a pipeline rank computes at least what the dp x tp rank of its tp and checkpointing with dp x
    // pp data ranks computes (the same FLOPs over the same ranks), stretched by the bubble of
    // uniform stages, (p - 1) / (v m); one whose bound is slower than the keep-th fastest plan is
    // not simulated (a rejection says so). With fewer fitting plans than that, every pipeline is.
    SearchResult run() {
        std::vector<PlanChoice> flat, piped;
        for (PlanChoice& c : meshes()) (c.pp > 1 ? piped : flat).push_back(std::move(c));
        check_cost(flat, piped);
        evaluate_flat(flat);
        std::vector<double> steps;
        for (const Candidate& c : r_.fitting) steps.push_back(c.time.step);
        std::sort(steps.begin(), steps.end());
        const double kept = o_.keep > 0 && static_cast<int>(steps.size()) >= o_.keep ? steps[o_.keep - 1] : 0;
        if (o_.pipelines == "never" || (o_.pipelines == "auto" && kept > 0 && !piped.empty())) {
            if (!piped.empty())
                r_.pipelines_skipped = o_.pipelines == "never"
                                           ? std::string("--pipeline never")
                                           : fmt::format(
                                                 "{} dp x tp plans fit, as many as listed (--pipeline always "
                                                 "searches them too)",
                                                 steps.size());
            piped.clear();
        }
        std::vector<PlanChoice> worth;
        for (PlanChoice& c : piped) {
            double compute = 0;  // the fastest compute of a fitting dp x tp plan over the same ranks
            for (const Candidate& f : r_.fitting)
                if (f.choice.pp == 1 && f.choice.cp == 1 && f.choice.tp == c.tp &&
                    f.choice.dp == c.dp * c.pp && f.choice.same_checkpointing(c) &&
                    (compute == 0 || f.time.compute < compute))
                    compute = f.time.compute;
            const int m = pipeline_microbatches(c);
            const double bound =
                compute * (1 + static_cast<double>(c.pp - 1) / (c.virtual_stages * std::max(m, 1)));
            if (kept > 0 && compute > 0 && m > 0 && bound > kept) {
                r_.rejected.push_back(
                    {pipeline_shape(c),
                     fmt::format("at least {:.2f} s a step (dp={} x tp={}'s compute and a bubble "
                                 "of {} / ({} x {})) > the {} fastest plans' {:.2f} s: not simulated",
                                 bound, c.dp * c.pp, c.tp, c.pp - 1, c.virtual_stages, m, o_.keep, kept),
                     RejectionKind::slower});
                continue;
            }
            worth.push_back(std::move(c));
        }
        // memory first: a pipeline is simulated once every lighter variant of it (lighter_variants)
        // fits; where one does not, neither does it (a rejection says which)
        std::map<std::string, bool> fits;  // pipeline_shape -> it fit
        while (!worth.empty()) {
            std::set<std::string> pending;
            for (const PlanChoice& c : worth) pending.insert(pipeline_shape(c));
            std::vector<PlanChoice> wave, later;
            for (PlanChoice& c : worth) {
                std::optional<std::string> over;
                bool ready = true;
                for (const PlanChoice& l : lighter_variants(c)) {
                    const std::string key = pipeline_shape(l);
                    if (auto it = fits.find(key); it != fits.end() && !it->second) over = key;
                    if (pending.count(key)) ready = false;
                }
                if (over) {
                    r_.rejected.push_back(
                        {pipeline_shape(c),
                         fmt::format("does not fit where {} does not: not simulated", *over),
                         RejectionKind::memory_implied});
                    fits[pipeline_shape(c)] = false;
                } else {
                    (ready ? wave : later).push_back(std::move(c));
                }
            }
            const size_t before = r_.fitting.size();
            evaluate_all(wave);
            for (const PlanChoice& c : wave) fits[pipeline_shape(c)] = false;
            for (size_t i = before; i < r_.fitting.size(); ++i)
                fits[pipeline_shape(r_.fitting[i].choice)] = true;
            worth = std::move(later);
        }
        std::stable_sort(r_.fitting.begin(), r_.fitting.end(), [](const Candidate& a, const Candidate& b) {
            if (a.time.step != b.time.step) return a.time.step < b.time.step;
            return a.peak < b.peak;
        });
        return std::move(r_);
    }

private:
    // The search's cost, bounded before it starts (docs/planning.md, "What plan costs"): each group
    // simulates at most a model variant per microbatch count it tries (the model's, doubled up to
    // --max-microbatches; a pipeline's samples), each building the variant's modules (16 units a
    // module, as explain's bound) and running them forward and backward per microbatch and step. A
    // variant holds the modules outside the extrapolated repeat and at most 3 of its blocks (2 and
    // 3 blocks: extrapolate), a pipeline's sample at most 3 blocks a stage of 4 pp ranks, else the
    // whole model. Past kPlanWork units: InputError naming the product and the fix.
    static constexpr int64_t kPlanWork = int64_t{1} << 24, kBuildWeight = 16;
    void check_cost(const std::vector<PlanChoice>& flat, const std::vector<PlanChoice>& piped) const {
        const double total = static_cast<double>(modules_under(*full_.root));
        double block = 0;  // the extrapolated repeat's block
        if (extrapolate_)
            for_each_module(*full_.root, [&](const std::string& fqn, Module& m) {
                if (fqn == repeat_) block = static_cast<double>(modules_under(*m.children().front().second));
            });
        const double other = total - block * static_cast<double>(layers_);
        auto run_units = [&](double modules, double microbatches) {  // a variant simulated for 2 steps
            return modules * (kBuildWeight + 2 * microbatches);
        };
        double work = 0;
        const double first = static_cast<double>(std::max<int64_t>(1, full_.gradient_accumulation));
        for (const PlanChoice& c : flat) {
            (void)c;
            for (double mb = first; mb <= std::max<double>(o_.max_microbatches, first); mb *= 2)
                work += extrapolate_ ? run_units(2 * other + 5 * block, mb) : run_units(total, mb);
        }
        for (const PlanChoice& c : piped) {
            const double stages = std::min(c.pp, 4) * c.virtual_stages,
                         blocks = std::min<double>(static_cast<double>(layers_), 3 * stages),
                         variant = extrapolate_ ? other + blocks * block : total;
            work += 2 * 2 * run_units(variant / std::min(c.pp, 4), 4 * stages);  // 2 sizes, 2 samples
        }
        if (work <= static_cast<double>(kPlanWork)) return;
        throw InputError(fmt::format(
            "plan would simulate {} candidate meshes of a model of {:.0f} modules ({:.0f} a block of "
            "'{}'): about {:.3g} units of work (a module built counts {}, its forward and backward of "
            "one microbatch 1), over ptool's bound of {}: plan a proxy of the model with fewer experts "
            "or smaller blocks (ptool shrink), fewer GPUs (--world-size), or --pipeline never",
            flat.size() + piped.size(), total, block, repeat_, work, kBuildWeight, kPlanWork));
    }

    // The dp x tp groups, fully_shard's first: a group that holds whole parameters (replicate,
    // ZeRO-1/2) or shards them over fewer ranks (HSDP) needs at least what fully_shard over the same
    // dp, tp and checkpointing needs at every microbatch count, where a block is at most a quarter
    // of the parameters (a repeat of 4 or more: fully_shard's transients are a gathered unit, its
    // prefetch and its unsharded gradients, 3 blocks, against the parameters and gradients the
    // others hold whole). Where fully_shard does not fit, neither do they: not simulated.
    void evaluate_flat(std::vector<PlanChoice> groups) {
        auto lightest = [](const PlanChoice& c) { return c.dp_mode == "fully_shard" && !c.hybrid(); };
        auto sibling = [&](const PlanChoice& c) {
            return fmt::format("dp={} x tp={}{}", c.dp, c.tp, checkpointed(c));
        };
        if (!extrapolate_) return evaluate_all(groups);
        std::vector<PlanChoice> first, rest;
        for (PlanChoice& c : groups) (lightest(c) ? first : rest).push_back(std::move(c));
        evaluate_all(first);
        std::set<std::string> fit;
        for (const Candidate& f : r_.fitting) fit.insert(sibling(f.choice));
        std::vector<PlanChoice> worth;
        for (PlanChoice& c : rest) {
            if (fit.count(sibling(c)) || c.dp == 1) {
                worth.push_back(std::move(c));
                continue;
            }
            r_.rejected.push_back(
                {fmt::format("dp={} x tp={} {}{}", c.dp, c.tp, c.mode_name(), checkpointed(c)),
                 fmt::format("does not fit where dp={} x tp={} fully_shard{} does not: not "
                             "simulated",
                             c.dp, c.tp, checkpointed(c)),
                 RejectionKind::memory_implied});
        }
        evaluate_all(worth);
    }

    void evaluate_all(const std::vector<PlanChoice>& groups) {
        std::vector<std::optional<Candidate>> fits(groups.size());
        std::vector<std::optional<Rejection>> refusals(groups.size());
        std::vector<int> counts(groups.size(), 0);
        // the longest first (a pipeline's samples run its microbatches on v stages a rank), so that
        // no thread is left with a long one at the end
        std::vector<size_t> order(groups.size());
        std::iota(order.begin(), order.end(), size_t{0});
        auto cost = [&](const PlanChoice& c) {
            return c.pp > 1
                       ? static_cast<int64_t>(pipeline_microbatches(c)) * c.virtual_stages * c.virtual_stages
                       : 0;
        };
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return cost(groups[a]) > cost(groups[b]); });
        parallel_for(groups.size(), o_.threads, [&](size_t k) {
            const size_t i = order[k];
            evaluate(groups[i], fits[i], refusals[i], counts[i]);
        });
        for (size_t i = 0; i < groups.size(); ++i) {  // in group order: the same output on any thread count
            if (fits[i]) r_.fitting.push_back(*fits[i]);
            if (refusals[i]) r_.rejected.push_back(*refusals[i]);
            r_.evaluated += counts[i];
        }
    }

    // The variants of pipeline `c` (the same pp, dp and tp) that need no more memory than it:
    // fully_shard where it replicates (shards of the parameters, gradients and optimizer state, not
    // the whole), checkpointed where it is not (a block's activations recomputed, not kept), 1F1B
    // where it interleaves (pp rank r holds at most pp - r stages' activations of microbatches in
    // flight; interleaved's warm-up ((v + 1) pp - 2 r - 1) / v of them, (pp + (v - 2) r - 1) / v more).
    std::vector<PlanChoice> lighter_variants(const PlanChoice& c) const {
        std::vector<PlanChoice> out;
        if (c.dp_mode == "replicate") out.push_back(c), out.back().dp_mode = "fully_shard";
        if (!c.checkpoint && !blocks_.empty())  // the op policy keeps less than no checkpointing
            out.push_back(c), out.back().checkpoint = true, out.back().selective = true;
        if (c.selective) out.push_back(c), out.back().selective = false;  // and full less than the op policy
        if (c.virtual_stages > 1)
            out.push_back(c), out.back().schedule = "1f1b", out.back().virtual_stages = 1;
        return out;
    }

    // A pipeline's microbatches a round: the most its rows per dp rank and round allow, a power of
    // two times pp (the smallest bubble, the least held at once; microbatches of one row as
    // torchtitan's default); 0 when they do not cut into pp.
    int pipeline_microbatches(const PlanChoice& c) const {
        const int64_t per_round = rows_ / c.dp / std::max<int64_t>(1, full_.gradient_accumulation);
        if (per_round % c.pp) return 0;
        int m = c.pp;
        while (per_round % (2 * m) == 0) m *= 2;
        return m;
    }

    // The repeated blocks' activation checkpointing a candidate may have: none, torchtitan's op-level
    // selective policy, full (checkpoint, selective)
    static constexpr std::pair<bool, bool> kCheckpointing[] = {{false, false}, {true, true}, {true, false}};
    static std::string checkpointed(const PlanChoice& c) {
        return !c.checkpoint ? "" : c.selective ? " checkpointed (op)" : " checkpointed";
    }

    static std::string pipeline_shape(const PlanChoice& c) {
        return fmt::format("pp={} x dp={} x tp={} {} {}{}{}", c.pp, c.dp, c.tp, c.mode_name(), c.schedule,
                           c.virtual_stages > 1 ? fmt::format(" v{}", c.virtual_stages) : "",
                           checkpointed(c));
    }

    // Why the experts do not split over ep ranks ("" when every moe layer's do).
    std::string expert_split(int ep) const {
        for (const auto& [fqn, experts] : experts_)
            if (experts % ep)
                return fmt::format("expert parallel: moe '{}' has {} experts, which do not divide over ep={}",
                                   fqn, experts, ep);
        return "";
    }

    static Model load_meta(const std::string& text, const std::string& name) {
        MetaAllocation meta;
        return load_model_text(text, name, "", false);
    }

    // The dp x tp meshes the lint accepts, each with its modes and checkpointing; the rest rejected.
    std::vector<PlanChoice> meshes() {
        std::vector<PlanChoice> groups;
        for (int tp = 1; tp <= r_.world_size; ++tp) {
            if (r_.world_size % tp) continue;
            const int dp = r_.world_size / tp;
            const std::string mesh = fmt::format("dp={} x tp={}", dp, tp);
            if (tp > 1 && !tpl_.unsupported.empty()) {
                r_.rejected.push_back({fmt::format("tp={}", tp),
                                       "no tensor-parallel plan: " + tpl_.unsupported,
                                       RejectionKind::topology});
                continue;
            }
            if (tp > cluster_.gpus_per_node || cluster_.gpus_per_node % tp) {
                r_.rejected.push_back(
                    {fmt::format("tp={}", tp),
                     fmt::format(
                         "crosses a node of {} GPUs (tensor parallelism's collectives block the compute: "
                         "NVLink only)",
                         cluster_.gpus_per_node),
                     RejectionKind::topology});
                continue;
            }
            PlanChoice tp_only;
            tp_only.tp = tp, tp_only.param_dtype = o_.param_dtype;
            add_pipelines(tp_only, groups);
            add_context_parallel(tp_only, groups);
            if (rows_ % dp) {
                r_.rejected.push_back({mesh,
                                       fmt::format("the batch's {} rows do not split over dp={}", rows_, dp),
                                       RejectionKind::indivisible});
                continue;
            }
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
            for (const char* mode : {"fully_shard", "replicate", "hsdp"}) {
                if (dp == 1 && std::string(mode) == "replicate") continue;  // one rank: nothing to choose
                if (std::string(mode) == "hsdp" && !hsdp) continue;
                for (const auto& [ckpt, op] : kCheckpointing) {
                    if (ckpt && blocks_.empty()) continue;
                    PlanChoice c = base;
                    c.dp_mode = std::string(mode) == "hsdp" ? "fully_shard" : mode, c.checkpoint = ckpt;
                    c.selective = op;
                    if (std::string(mode) == "hsdp") c.dp_shard = node_shard;
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
                                r_.rejected.push_back({fmt::format("{} {}", mesh, e.mode_name()), why,
                                                       RejectionKind::indivisible});
                        } else {
                            groups.push_back(e);
                        }
                    }
                    // ZeRO-1 and ZeRO-2 (parallel/zero_optimizer.h): replicate's communication
                    // with the optimizer state (and gradients) sharded over dp
                    if (std::string(mode) == "replicate")
                        for (int stage : {1, 2}) groups.push_back(c), groups.back().zero_stage = stage;
                }
            }
        }
        return groups;
    }

    // Context parallel over the tp of `base` (its tp accepted): cp a power of two with cp x tp
    // within a node (the attention's key/value collectives block the compute: NVLink only, as tp's),
    // the sequence in 2 x cp chunks (load-balanced), dp the rest; fully_shard over dp x cp (as
    // torchtitan composes them), checkpointing or not.
    void add_context_parallel(const PlanChoice& base, std::vector<PlanChoice>& groups) {
        const Shape& in = full_.input.shape;
        if (in.size() < (full_.input.ids ? 2u : 3u)) return;  // no sequence dim
        for (int cp = 2; cp * base.tp <= cluster_.gpus_per_node && r_.world_size % (cp * base.tp) == 0;
             cp *= 2) {
            const int dp = r_.world_size / base.tp / cp;
            const std::string shape = fmt::format("dp={} x cp={} x tp={}", dp, cp, base.tp);
            if (in[1] % (2 * cp) != 0) {
                r_.rejected.push_back(
                    {shape,
                     fmt::format("the sequence of {} does not cut into {} chunks (2 x cp)", in[1], 2 * cp),
                     RejectionKind::indivisible});
                continue;
            }
            if (rows_ % dp) {
                r_.rejected.push_back({shape,
                                       fmt::format("the batch's {} rows do not split over dp={}", rows_, dp),
                                       RejectionKind::indivisible});
                continue;
            }
            PlanChoice c = base;
            c.dp = dp, c.cp = cp;
            if (std::string why = lint(c); !why.empty()) {
                r_.rejected.push_back({shape, why, RejectionKind::refused});
                continue;
            }
            for (const auto& [ckpt, op] : kCheckpointing) {
                if (ckpt && blocks_.empty()) continue;
                c.dp_mode = "fully_shard", c.checkpoint = ckpt, c.selective = op;
                groups.push_back(c);
            }
        }
    }

    // Pipelines over the tp of `base` (its tp and lint accepted): pp ranks outermost, pp a power of
    // two dividing world / tp with at least one block per stage, dp the rest; fully_shard or
    // replicate inside each stage, checkpointing or not, 1F1B and interleaved 1F1B (v 2).
    void add_pipelines(const PlanChoice& base, std::vector<PlanChoice>& groups) {
        if (!extrapolate_) return;  // a stage's costs are extrapolated over the blocks of one long repeat
        for (int pp = 2; pp <= r_.world_size / base.tp && pp <= layers_; pp *= 2) {
            if ((r_.world_size / base.tp) % pp) break;
            const int dp = r_.world_size / base.tp / pp;
            for (const auto& [schedule, v] :
                 {std::pair<const char*, int>{"1f1b", 1}, {"interleaved_1f1b", 2}}) {
                const std::string shape = fmt::format("pp={} x dp={} x tp={} {}", pp, dp, base.tp, schedule);
                if (layers_ < pp * v) {
                    r_.rejected.push_back({shape, fmt::format("{} blocks < {} stages", layers_, pp * v),
                                           RejectionKind::indivisible});
                    continue;
                }
                if (rows_ % dp) {
                    r_.rejected.push_back(
                        {shape, fmt::format("the batch's {} rows do not split over dp={}", rows_, dp),
                         RejectionKind::indivisible});
                    continue;
                }
                const int64_t per_round = rows_ / dp / std::max<int64_t>(1, full_.gradient_accumulation);
                if (per_round < pp) {
                    r_.rejected.push_back(
                        {shape,
                         fmt::format(
                             "{} microbatches < {} stages (the batch's {} rows over dp={}, {} round{})",
                             per_round, pp, rows_, dp, full_.gradient_accumulation,
                             full_.gradient_accumulation == 1 ? "" : "s"),
                         RejectionKind::indivisible});
                    continue;
                }
                for (const char* mode : {"fully_shard", "replicate"}) {
                    if (dp == 1 && std::string(mode) == "replicate") continue;
                    for (const auto& [ckpt, op] : kCheckpointing) {
                        if (ckpt && blocks_.empty()) continue;
                        PlanChoice c = base;
                        c.dp = dp, c.pp = pp, c.schedule = schedule, c.virtual_stages = v, c.repeat = repeat_;
                        c.dp_mode = mode, c.checkpoint = ckpt, c.selective = op;
                        groups.push_back(c);
                    }
                }
            }
        }
    }

    // Why explain's rules refuse the mesh ("" if they do not): uneven shards (heads, features,
    // vocab, sequence), a conflict, or a plan that changes what is computed.
    std::string lint(PlanChoice c) const {
        c.dp_mode = "fully_shard";
        try {
            const Explanation ex =
                explain_plan(full_, load_plan_text(write_plan(full_, tpl_, c), "generated.yaml"));
            for (const Diagnostic& w : ex.resolution.warnings)
                if (w.kind == DiagnosticKind::uneven_shard) return w.message;
            if (!ex.resolution.causes.empty()) return ex.resolution.causes.front().message;
        } catch (const InputError& e) {
            return e.message();
        }
        return "";
    }

    Simulated simulate_with(int64_t mb, const Plan& plan) const {
        if (!extrapolate_) return simulate(model_variant(text_, 0, mb), name_, plan);
        const Simulated a = simulate(model_variant(text_, 2, mb), name_, plan, repeat_, 2);
        const Simulated b = simulate(model_variant(text_, 3, mb), name_, plan, repeat_, 3);
        return extrapolate(a, b, static_cast<double>(layers_ - 2));
    }

    // The model's microbatches, doubled until the group's plan fits under the cap.
    void evaluate(const PlanChoice& c, std::optional<Candidate>& fit, std::optional<Rejection>& refusal,
                  int& count) const {
        if (c.pp > 1) return evaluate_pipeline(c, fit, refusal, count);
        const std::string dp =
            c.hybrid() ? fmt::format("{}x{}", c.dp_replicate(), c.dp_shard) : std::to_string(c.dp);
        const std::string shape =
            fmt::format("dp={}{} x tp={} {}{}", dp, c.cp > 1 ? fmt::format(" x cp={}", c.cp) : "", c.tp,
                        c.mode_name(), checkpointed(c));
        const std::string plan_text = write_plan(full_, tpl_, c);
        const Plan plan = load_plan_text(plan_text, "generated.yaml");
        const int64_t first = full_.gradient_accumulation,
                      last = std::max<int64_t>(o_.max_microbatches, first);
        double least = 0;
        int64_t least_mb = 0;
        for (int64_t mb = first; mb <= last && rows_ % (static_cast<int64_t>(c.dp) * mb) == 0; mb *= 2) {
            Simulated s;
            try {
                s = simulate_with(mb, plan);
            } catch (const InputError& e) {
                refusal = Rejection{shape, e.message(), RejectionKind::refused};
                return;
            }
            ++count;
            Candidate cand;
            cand.choice = c, cand.microbatches = static_cast<int>(mb),
            cand.model_microbatches = static_cast<int>(first);
            // the plan carries the microbatches it was chosen with where they are not the model's
            if (mb != first) cand.choice.gradient_accumulation = static_cast<int>(mb);
            cand.plan_text = mb == first ? plan_text : write_plan(full_, tpl_, cand.choice);
            cand.extrapolated = extrapolate_;
            cand.prefetch = c.dp_mode == "fully_shard" && c.dp > 1 ? block_unsharded_ / c.tp : 0;
            cand.peak = static_cast<double>(s.memory.peak) + cand.prefetch;
            cand.reserved =
                static_cast<double>(std::max(s.memory.peak, s.memory.reserved_peak)) + cand.prefetch;
            if (least_mb == 0 || cand.reserved < least) least = cand.reserved, least_mb = mb;
            if (cand.reserved > cap(plan)) continue;
            cand.runtime = runtime(plan);
            cand.time = predict_step_time(s.work, s.comm, plan, cluster_, r_.compute);
            cand.mfu = mfu(cand.time, cluster_, r_.compute);
            fit = std::move(cand);
            return;
        }
        if (least_mb == 0)
            refusal =
                Rejection{shape, fmt::format("the batch's {} rows do not split into microbatches", rows_),
                          RejectionKind::indivisible};
        else
            refusal = Rejection{shape,
                                fmt::format("needs {} > {} per GPU (at best, with {} microbatch{})",
                                            gib(least), gib(cap(plan)), least_mb, least_mb == 1 ? "" : "es"),
                                RejectionKind::memory};
    }

    // A pipeline: its microbatches per round the most the rows allow (a power of two times pp: the
    // smallest bubble and the least held at once, microbatches of one row as torchtitan's default),
    // sampled at 2 and 3 blocks per stage, stages balanced by their predicted time, the step the
    // schedule's critical path (plan/pipeline_search.h).
    void evaluate_pipeline(const PlanChoice& base, std::optional<Candidate>& fit,
                           std::optional<Rejection>& refusal, int& count) const {
        const std::string shape = pipeline_shape(base);
        const int64_t rounds = full_.gradient_accumulation, per_round = rows_ / base.dp / rounds;
        const int stages = base.pp * base.virtual_stages;
        const int m = pipeline_microbatches(base);
        if (m == 0) {
            refusal = Rejection{shape,
                                fmt::format("{} rows per dp rank and round do not cut into {} microbatches",
                                            per_round, base.pp),
                                RejectionKind::indivisible};
            return;
        }
        const ScheduleKind kind =
            base.virtual_stages > 1 ? ScheduleKind::interleaved_one_f_one_b : ScheduleKind::one_f_one_b;
        // Sampled with the fewest microbatches that reach the schedule's steady state, each of the
        // same rows: a 1F1B stage holds min(pp - s, m) of them at once, so its peak, its
        // per-microbatch costs and its tail are the same, and the simulation costs m_min / m of it.
        // (interleaved's warm-up runs up to (v - 1) pp + 2 (pp - 1) forwards on rank 0, then its
        // steady state adds one before each backward: 2 pp microbatches reach it, pp do not)
        const int v = base.virtual_stages;
        const int sampled = std::min(m, v > 1 ? 2 * base.pp : base.pp);
        PipelineSample at[2];
        const double prefetch = base.dp_mode == "fully_shard" && base.dp > 1 ? block_unsharded_ / base.tp : 0;
        const int per_pp_rank = r_.world_size / base.pp;
        // Past 4 pp ranks the samples are pipelines of 3 and 4 ranks (the same dp, tp and stages of
        // k blocks) widened to pp (widen_pipeline): a rank's microbatches in flight grow linearly
        // with pp, and the simulations no longer do.
        const bool widened = base.pp > 4;
        // the plan and model of P pp ranks with stages of k blocks each, and one rank's simulation
        // of them (each simulated once: a middle rank's two come first, for the bound below)
        // (P ranks run microbatches in the same ratio to their ranks as the plan's samples: 1 or 2)
        auto sampled_at = [&](int P) { return P * (sampled / base.pp); };
        std::map<std::tuple<int, int, int>, std::pair<Plan, std::string>> variants;
        std::map<std::tuple<int, int, int>, RankSimulation> simulated;
        double fragmentation = 0;  // the samples' largest reserved - peak
        auto variant = [&](int P, int k, int microbatches) -> const std::pair<Plan, std::string>& {
            if (auto it = variants.find({P, k, microbatches}); it != variants.end()) return it->second;
            PlanChoice c = base;
            c.pp = P, c.pp_microbatches = microbatches, c.stage_blocks.assign(P * v, k);
            return variants
                .emplace(std::make_tuple(P, k, microbatches),
                         std::make_pair(load_plan_text(write_plan(full_, tpl_, c), "generated.yaml"),
                                        model_variant(text_, static_cast<int64_t>(k) * P * v, rounds,
                                                      rows_ / m * microbatches)))
                .first->second;
        };
        auto simulate_at = [&](int P, int k, int rank) -> RankSimulation {
            if (auto it = simulated.find({P, k, rank}); it != simulated.end()) return std::move(it->second);
            const int own = sampled_at(P);
            const auto& [plan, text] = variant(P, k, own);
            RunInputs in;
            in.model_path = name_, in.model_text = text;
            ++count;
            RankSimulation sim = simulate_rank(in, plan, rank, 2, true);
            // the caching allocator's excess over the tensors' peak (as extrapolate's)
            fragmentation =
                std::max(fragmentation, static_cast<double>(sim.memory.reserved_peak - sim.memory.peak));
            // every stage holds 2 blocks or more when the blocks are at least twice the stages, and
            // a rank's microbatches in flight and the last rank's outputs only grow with pp and the
            // microbatches: a rank over the cap here is over it in the plan (the others not simulated)
            const int pp_rank = rank / per_pp_rank;
            if (k == 2 && layers_ >= 2 * stages &&
                static_cast<double>(sim.memory.peak) + prefetch > cap(plan))
                throw InputError(fmt::format(
                    "pp rank {} needs more than {} > {} per GPU with 2 blocks a stage ({} microbatches a "
                    "round)",
                    pp_rank == P - 1 ? base.pp - 1 : pp_rank,
                    gib(static_cast<double>(sim.memory.peak) + prefetch), gib(cap(plan)), m));
            if (pp_rank == P - 1 && m > sampled && !(widened && v == 1)) {  // (widened 1F1B: widen_pipeline)
                // the last stage keeps every microbatch's output for the step (StepOutput): its peak
                // grows with the count, linearly from the sample at twice as many, by the m - sampled
                // microbatches the plan runs beyond its samples
                const auto& [plan2, text2] = variant(P, k, 2 * own);
                RunInputs in2 = in;
                in2.model_text = text2;
                ++count;
                const RankSimulation twice = simulate_rank(in2, plan2, rank, 2, true);
                const double f = static_cast<double>(m - sampled) / own;
                auto lin = [f](int64_t x, int64_t y) { return static_cast<int64_t>(x + (y - x) * f); };
                sim.memory.peak = lin(sim.memory.peak, twice.memory.peak);
                for (auto& [label, peak] : sim.phase_peaks)
                    if (auto it = twice.phase_peaks.find(label); it != twice.phase_peaks.end())
                        peak = lin(peak, it->second);
            }
            return sim;
        };
        // widened samples are timed on the links of the plan itself: its pp ranks may span nodes
        // where P ranks do not
        std::optional<Plan> timing;
        if (widened) {
            PlanChoice real = base;
            real.pp_microbatches = sampled, real.stage_blocks.assign(stages, 2);
            timing = load_plan_text(write_plan(full_, tpl_, real), "generated.yaml");
        }
        auto sample_at = [&](int P, int k) {
            return sample_pipeline(
                variant(P, k, sampled_at(P)).first, cluster_, r_.compute, repeat_, k,
                [&](int rank) { return simulate_at(P, k, rank); }, timing ? &*timing : nullptr);
        };
        try {
            if (base.pp >= 3 && layers_ >= 2 * stages) {
                // A middle rank's peak at 2 and 3 blocks a stage (widened from 3 and 4 ranks where
                // the plan has more), extended to layers / stages: its peak grows with its blocks and
                // its microbatches in flight, each pass's linearly (so the largest, convexly: the line
                // through two samples stays under it), and the middle stages are cut at least that
                // long (the first and the last get fewer). Over the cap, the plan is too.
                double at_k[2];
                for (int k : {2, 3}) {
                    std::vector<double> peaks;
                    for (int P : widened ? std::vector<int>{3, 4} : std::vector<int>{base.pp}) {
                        RankSimulation sim = simulate_at(P, k, per_pp_rank);
                        peaks.push_back(static_cast<double>(sim.memory.peak));
                        simulated.emplace(std::make_tuple(P, k, per_pp_rank), std::move(sim));
                    }
                    at_k[k - 2] = widened ? peaks[0] + (peaks[1] - peaks[0]) * (base.pp - 3) : peaks[0];
                }
                const int64_t x = layers_ / stages;
                const double least = at_k[0] + (at_k[1] - at_k[0]) * static_cast<double>(x - 2) + prefetch;
                const int P = widened ? 4 : base.pp;  // a middle rank's communicators are the plan's
                if (const double c = cap(variant(P, 2, sampled_at(P)).first); least > c) {
                    refusal =
                        Rejection{shape,
                                  fmt::format("pp rank 1 needs more than {} > {} per GPU with {} blocks a "
                                              "stage, as every middle rank ({} microbatches a round)",
                                              gib(least), gib(c), x, m),
                                  RejectionKind::memory};
                    return;
                }
            }
            for (int k : {2, 3})
                at[k - 2] =
                    widened ? widen_pipeline(sample_at(3, k), sample_at(4, k), base.pp, v == 1 ? m : base.pp)
                            : sample_at(base.pp, k);
        } catch (const InputError& e) {
            refusal = Rejection{shape, e.message(), RejectionKind::refused};
            return;
        }
        // a stage's forward and backward of every microbatch: its fixed part and one block's
        std::vector<double> t2(stages), t3(stages);
        for (int s = 0; s < stages; ++s)
            t2[s] = at[0].forward[s] + at[0].backward[s], t3[s] = at[1].forward[s] + at[1].backward[s];
        const int mid = stages > 2 ? 1 : 0;
        const double per_block = std::max(0.0, t3[mid] - t2[mid]);
        std::vector<double> extra(stages);
        for (int s = 0; s < stages; ++s) extra[s] = t2[s] - 2 * per_block;
        PlanChoice c = base;
        c.pp_microbatches = m;
        c.stage_blocks = balance_blocks(static_cast<int>(layers_), extra, per_block);
        const PipelineSample costs = extrapolate_pipeline(at[0], at[1], c.stage_blocks, c.pp);
        Candidate cand;
        cand.choice = c, cand.microbatches = static_cast<int>(rounds),
        cand.model_microbatches = static_cast<int>(rounds);
        cand.plan_text = write_plan(full_, tpl_, c), cand.extrapolated = true;
        cand.prefetch = prefetch;
        const auto worst = std::max_element(costs.peak.begin(), costs.peak.end());
        cand.peak = *worst + cand.prefetch;
        cand.reserved = *worst + fragmentation + cand.prefetch;
        const Plan written = load_plan_text(cand.plan_text, "generated.yaml");
        if (const double c = cap(written); cand.reserved > c) {
            refusal = Rejection{shape,
                                fmt::format("pp rank {} needs {} > {} per GPU ({} microbatches a round)",
                                            worst - costs.peak.begin(), gib(cand.reserved), gib(c), m),
                                RejectionKind::memory};
            return;
        }
        cand.runtime = runtime(written);
        const PipelineTiming t =
            time_pipeline_schedule(kind, stages, m, static_cast<int>(rounds), base.virtual_stages, costs);
        double flops = 0;  // the model FLOPs of a rank, averaged over the pp ranks
        for (int s = 0; s < stages; ++s)
            flops += (costs.forward_flops[s] + costs.backward_flops[s]) * m * rounds;
        cand.time.model_flops = cand.time.gemm_flops = flops / c.pp;
        const Plan plan = load_plan_text(cand.plan_text, "generated.yaml");
        CommByOpDim comm = costs.tail_comm;  // pp rank 0's; its forwards' and backwards' m / sampled as often
        for (const auto& [key, t] : costs.fb_comm)
            comm[key].calls += t.calls * m / sampled, comm[key].bytes += t.bytes * m / sampled;
        add_comm_time(cand.time, comm, plan, cluster_);  // by_dim (the step is the critical path's)
        double exposed = 0;
        for (int r = 0; r < c.pp; ++r)
            exposed = std::max(exposed, costs.exposed(r, static_cast<double>(m) / sampled));
        cand.time.compute = *std::max_element(t.busy.begin(), t.busy.end());
        cand.time.pipeline = t.step, cand.time.bubble = t.bubble;
        cand.time.step = t.step + exposed;
        cand.mfu = mfu(cand.time, cluster_, r_.compute);
        fit = std::move(cand);
    }

    const std::string& text_;
    const std::string& name_;
    // What a plan's tensors may take per GPU: the cap less the runtime's memory on the plan's
    // neediest rank (plan/device_overheads.h); --memory-cap is the tensors' already.
    double runtime(const Plan& plan) const {
        return o_.memory_cap > 0 ? 0 : worst_device_overheads(cluster_, plan).total();
    }
    double cap(const Plan& plan) const { return r_.memory_cap - runtime(plan); }

    const Cluster& cluster_;
    const SearchOptions& o_;
    const Model full_;
    SearchResult r_;
    TensorParallelTemplate tpl_;
    std::vector<std::string> blocks_;
    std::vector<std::pair<std::string, int64_t>> experts_;  // each moe layer and its experts
    int64_t layers_ = 0, rows_ = 0;
    std::string repeat_;  // the repeat extrapolated over
    bool extrapolate_ = false;
    double block_unsharded_ = 0;
};

}  // namespace

SearchResult search_plans(const std::string& model_text, const std::string& name, const Cluster& cluster,
                          const SearchOptions& o) {
    return Search(model_text, name, cluster, o).run();
}

}  // namespace ptool
