#include "plan/search.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel_for.h"
#include "plan/explain.h"
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
    o.memory.resident = static_cast<int64_t>(lin(a.memory.resident, b.memory.resident));
    for (int u = 0; u < kMemoryUses; ++u)
        o.memory.at_peak[u] = static_cast<int64_t>(lin(a.memory.at_peak[u], b.memory.at_peak[u]));
    o.work.gemm_flops = lin(a.work.gemm_flops, b.work.gemm_flops);
    o.work.recompute_flops = lin(a.work.recompute_flops, b.work.recompute_flops);
    o.work.memory_bytes = lin(a.work.memory_bytes, b.work.memory_bytes);
    o.work.kernels = static_cast<int64_t>(lin(a.work.kernels, b.work.kernels));
    for (const auto* src : {&a.comm, &b.comm})
        for (const auto& [key, t] : *src) o.comm[key];
    for (auto& [key, t] : o.comm) {
        const CommTotals x = a.comm.count(key) ? a.comm.at(key) : CommTotals{},
                         y = b.comm.count(key) ? b.comm.at(key) : CommTotals{};
        t.calls = static_cast<int64_t>(lin(x.calls, y.calls));
        t.bytes = static_cast<int64_t>(lin(x.bytes, y.bytes));
    }
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

    SearchResult run() {
        const std::vector<PlanChoice> groups = meshes();
        std::vector<std::optional<Candidate>> fits(groups.size());
        std::vector<std::optional<Rejection>> refusals(groups.size());
        std::vector<int> counts(groups.size(), 0);
        parallel_for(groups.size(), o_.threads,
                     [&](size_t i) { evaluate(groups[i], fits[i], refusals[i], counts[i]); });
        for (size_t i = 0; i < groups.size(); ++i) {  // in group order: the same output on any thread count
            if (fits[i]) r_.fitting.push_back(*fits[i]);
            if (refusals[i]) r_.rejected.push_back(*refusals[i]);
            r_.evaluated += counts[i];
        }
        std::stable_sort(r_.fitting.begin(), r_.fitting.end(), [](const Candidate& a, const Candidate& b) {
            if (a.time.step != b.time.step) return a.time.step < b.time.step;
            return a.peak < b.peak;
        });
        return std::move(r_);
    }

private:
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
                r_.rejected.push_back(
                    {fmt::format("tp={}", tp), "no tensor-parallel plan: " + tpl_.unsupported});
                continue;
            }
            if (tp > cluster_.gpus_per_node || cluster_.gpus_per_node % tp) {
                r_.rejected.push_back(
                    {fmt::format("tp={}", tp),
                     fmt::format(
                         "crosses a node of {} GPUs (tensor parallelism's collectives block the compute: "
                         "NVLink only)",
                         cluster_.gpus_per_node)});
                continue;
            }
            if (rows_ % dp) {
                r_.rejected.push_back(
                    {mesh, fmt::format("the batch's {} rows do not split over dp={}", rows_, dp)});
                continue;
            }
            PlanChoice base;
            base.dp = dp, base.tp = tp, base.param_dtype = o_.param_dtype;
            if (std::string why = lint(base); !why.empty()) {
                r_.rejected.push_back({mesh, why});
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
                for (bool ckpt : {false, true}) {
                    if (ckpt && blocks_.empty()) continue;
                    PlanChoice c = base;
                    c.dp_mode = std::string(mode) == "hsdp" ? "fully_shard" : mode, c.checkpoint = ckpt;
                    if (std::string(mode) == "hsdp") c.dp_shard = node_shard;
                    groups.push_back(c);
                }
            }
        }
        return groups;
    }

    // Why explain's rules refuse the mesh ("" if they do not): uneven shards (heads, features,
    // vocab, sequence), a conflict, or a plan that changes what is computed.
    std::string lint(PlanChoice c) const {
        c.dp_mode = "fully_shard";
        try {
            const Explanation ex =
                explain_plan(full_, load_plan_text(write_plan(full_, tpl_, c), "generated.yaml"));
            for (const Diagnostic& w : ex.resolution.warnings)
                if (w.message.find("uneven") != std::string::npos) return w.message;
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
        const std::string dp =
            c.hybrid() ? fmt::format("{}x{}", c.dp_replicate(), c.dp_shard) : std::to_string(c.dp);
        const std::string shape =
            fmt::format("dp={} x tp={} {}{}", dp, c.tp, c.mode_name(), c.checkpoint ? " checkpointed" : "");
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
                refusal = Rejection{shape, e.message()};
                return;
            }
            ++count;
            Candidate cand;
            cand.choice = c, cand.microbatches = static_cast<int>(mb),
            cand.model_microbatches = static_cast<int>(first);
            cand.plan_text = plan_text, cand.extrapolated = extrapolate_;
            cand.prefetch = c.dp_mode == "fully_shard" && c.dp > 1 ? block_unsharded_ / c.tp : 0;
            cand.peak = static_cast<double>(s.memory.peak) + cand.prefetch;
            if (least_mb == 0 || cand.peak < least) least = cand.peak, least_mb = mb;
            if (cand.peak > r_.memory_cap) continue;
            cand.time = predict_step_time(s.work, s.comm, plan, cluster_, r_.compute);
            cand.mfu = mfu(cand.time, cluster_, r_.compute);
            fit = std::move(cand);
            return;
        }
        if (least_mb == 0)
            refusal =
                Rejection{shape, fmt::format("the batch's {} rows do not split into microbatches", rows_)};
        else
            refusal = Rejection{
                shape, fmt::format("needs {} > {} per GPU (at best, with {} microbatch{})", gib(least),
                                   gib(r_.memory_cap), least_mb, least_mb == 1 ? "" : "es")};
    }

    const std::string& text_;
    const std::string& name_;
    const Cluster& cluster_;
    const SearchOptions& o_;
    const Model full_;
    SearchResult r_;
    TensorParallelTemplate tpl_;
    std::vector<std::string> blocks_;
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
