#include "plan/search.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "plan/explain.h"
#include "plan/simulate.h"

namespace ptool {
namespace {

int long_repeats(const Model& m) {
    int n = 0;
    std::function<void(const Module&)> walk = [&](const Module& x) {
        if (x.type() == "repeat" && x.children().size() >= 4) ++n;
        for (const auto& [name, c] : x.children()) walk(*c);
    };
    walk(*m.root);
    return n;
}

int64_t largest_block_params(const Model& m) {  // the largest repeat element's parameter elements
    int64_t best = 0;
    std::function<void(const Module&)> walk = [&](const Module& x) {
        if (x.type() == "repeat" && !x.children().empty()) {
            int64_t n = 0;
            std::function<void(const Module&)> count = [&](const Module& y) {
                for (const auto& p : y.params()) n += p.param->value.numel();
                for (const auto& [name, c] : y.children()) count(*c);
            };
            count(*x.children().front().second);
            best = std::max(best, n);
        }
        for (const auto& [name, c] : x.children()) walk(*c);
    };
    walk(*m.root);
    return best;
}

std::string without_location(const std::string& what) {  // "plan.yaml:3:5: msg" -> "msg"
    size_t pos = what.find(": ");
    while (pos != std::string::npos) {  // the first ": " after "NAME:LINE:COL"
        size_t colon2 = what.rfind(':', pos - 1);
        size_t colon1 = colon2 == std::string::npos || colon2 == 0 ? std::string::npos : what.rfind(':', colon2 - 1);
        auto digits = [&](size_t a, size_t b) {
            return b > a && what.find_first_not_of("0123456789", a) >= b;
        };
        if (colon1 != std::string::npos && digits(colon1 + 1, colon2) && digits(colon2 + 1, pos)) return what.substr(pos + 2);
        pos = what.find(": ", pos + 2);
    }
    return what;
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1ull << 30)); }

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

Simulated simulate(const std::string& model_text, const std::string& name, const Plan& plan, const std::string& repeat = "",
                   int64_t count = 0) {
    RunInputs in;
    in.model_path = name;
    in.model_text = model_text;
    RankSimulation s = simulate_rank(in, plan, 0, 2, !repeat.empty());
    Simulated out{s.memory, s.step_work, by_op_dim(s.step_comm), {}};
    for (const auto& [label, peak] : s.phase_peaks)
        if (std::string key = block_phase(label, repeat, count); !key.empty()) out.phases[key] = std::max(out.phases[key], peak);
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
    for (int u = 0; u < kMemoryUses; ++u) o.memory.at_peak[u] = static_cast<int64_t>(lin(a.memory.at_peak[u], b.memory.at_peak[u]));
    o.work.gemm_flops = lin(a.work.gemm_flops, b.work.gemm_flops);
    o.work.recompute_flops = lin(a.work.recompute_flops, b.work.recompute_flops);
    o.work.memory_bytes = lin(a.work.memory_bytes, b.work.memory_bytes);
    o.work.kernels = static_cast<int64_t>(lin(a.work.kernels, b.work.kernels));
    for (const auto* src : {&a.comm, &b.comm})
        for (const auto& [key, t] : *src) o.comm[key];
    for (auto& [key, t] : o.comm) {
        const CommTotals x = a.comm.count(key) ? a.comm.at(key) : CommTotals{}, y = b.comm.count(key) ? b.comm.at(key) : CommTotals{};
        t.calls = static_cast<int64_t>(lin(x.calls, y.calls));
        t.bytes = static_cast<int64_t>(lin(x.bytes, y.bytes));
    }
    return o;
}

}  // namespace

std::string model_variant(const std::string& text, int64_t count, int64_t microbatches) {
    YAML::Node doc = YAML::Load(text);  // the loader accepted it already
    if (count > 0) {
        std::function<void(YAML::Node)> walk = [&](YAML::Node mods) {
            if (!mods || !mods.IsSequence()) return;
            for (YAML::Node m : mods) {
                if (m["type"] && m["type"].Scalar() == "repeat" && m["count"] && m["count"].as<int64_t>() >= 4) m["count"] = count;
                walk(m["modules"]);
            }
        };
        walk(doc["modules"]);
    }
    doc["gradient_accumulation"] = microbatches;
    YAML::Emitter e;
    e << doc;
    return e.c_str();
}

SearchResult search_plans(const std::string& model_text, const std::string& name, const Cluster& cluster, const SearchOptions& o) {
    SearchResult r;
    std::optional<MetaAllocation> meta(std::in_place);
    const Model full = load_model_text(model_text, name, "", false);
    meta.reset();
    r.world_size = o.world_size > 0 ? o.world_size : cluster.world_size();
    r.memory_cap = o.memory_cap > 0 ? o.memory_cap : cluster.memory_bytes - cluster.reserved_bytes;
    r.compute = o.param_dtype ? parse_dtype(*o.param_dtype) : full.dtype;
    if (r.world_size > cluster.world_size())
        throw InputError(fmt::format("--world-size {} is more than {}'s {} GPUs", r.world_size, cluster.name, cluster.world_size()));
    const TensorParallelTemplate tpl = tensor_parallel_template(full);
    r.tp_unsupported = tpl.unsupported;
    const std::vector<std::string> blocks = repeated_blocks(full);
    int64_t layers = 0;
    std::string repeat_fqn;  // the repeat extrapolated over
    std::function<void(const Module&)> find_repeat = [&](const Module& x) {
        if (x.type() == "repeat" && x.children().size() >= 4) layers = static_cast<int64_t>(x.children().size()), repeat_fqn = x.fqn();
        for (const auto& [nm, c] : x.children()) find_repeat(*c);
    };
    find_repeat(*full.root);
    const bool extrapolate_blocks = long_repeats(full) == 1;
    const double block_unsharded = static_cast<double>(largest_block_params(full)) * dtype_size(r.compute);
    const int64_t rows = full.input.shape.at(0);
    std::mutex mu;

    // One (tp, mode, checkpoint) group: microbatches 1, 2, 4, ... until one fits.
    struct Group {
        PlanChoice choice;
    };
    std::vector<Group> groups;
    for (int tp = 1; tp <= r.world_size; ++tp) {
        if (r.world_size % tp) continue;
        const int dp = r.world_size / tp;
        const std::string shape = fmt::format("tp={}", tp);
        if (tp > 1 && !tpl.unsupported.empty()) {
            r.rejected.push_back({shape, "no tensor-parallel plan: " + tpl.unsupported});
            continue;
        }
        if (tp > cluster.gpus_per_node || cluster.gpus_per_node % tp) {
            r.rejected.push_back({shape, fmt::format("crosses a node of {} GPUs (tensor parallelism's collectives block the compute: NVLink only)",
                                                     cluster.gpus_per_node)});
            continue;
        }
        if (rows % dp) {
            r.rejected.push_back({fmt::format("dp={} x tp={}", dp, tp), fmt::format("the batch's {} rows do not split over dp={}", rows, dp)});
            continue;
        }
        PlanChoice base;
        base.dp = dp, base.tp = tp, base.param_dtype = o.param_dtype;
        {  // the lint, once per mesh: divisibility of heads, features, vocab, sequence
            PlanChoice c = base;
            c.dp_mode = "fully_shard";
            try {
                const Plan plan = load_plan_text(write_plan(full, tpl, c), "generated.yaml");
                const Explanation ex = explain_plan(full, plan);
                std::string uneven;
                for (const auto& w : ex.resolution.warnings)
                    if (w.find("uneven") != std::string::npos && uneven.empty()) uneven = without_location(w);
                if (uneven.empty() && !ex.resolution.causes.empty()) uneven = without_location(ex.resolution.causes.front());
                if (!uneven.empty()) {  // uneven shards, or a plan that changes what is computed
                    r.rejected.push_back({fmt::format("dp={} x tp={}", dp, tp), uneven});
                    continue;
                }
            } catch (const InputError& e) {
                r.rejected.push_back({fmt::format("dp={} x tp={}", dp, tp), without_location(e.what())});
                continue;
            }
        }
        for (const char* mode : {"fully_shard", "replicate"}) {
            if (dp == 1 && std::string(mode) == "replicate") continue;  // one rank: nothing to choose
            for (bool ckpt : {false, true}) {
                if (ckpt && blocks.empty()) continue;
                PlanChoice c = base;
                c.dp_mode = mode, c.checkpoint = ckpt;
                groups.push_back({c});
            }
        }
    }

    std::atomic<size_t> next{0};
    std::atomic<int> evaluated{0};
    std::exception_ptr error;
    auto work = [&] {
        for (size_t gi; (gi = next++) < groups.size();) {
            const PlanChoice& c = groups[gi].choice;
            const std::string shape = fmt::format("dp={} x tp={} {}{}", c.dp, c.tp, c.dp_mode, c.checkpoint ? " checkpointed" : "");
            try {
                const std::string plan_text = write_plan(full, tpl, c);
                const Plan plan = load_plan_text(plan_text, "generated.yaml");
                double least = 0;
                int least_mb = 0;
                bool fitted = false;
                std::string refused;
                for (int64_t mb = full.gradient_accumulation; mb <= std::max<int64_t>(o.max_microbatches, full.gradient_accumulation) &&
                                                               rows % (static_cast<int64_t>(c.dp) * mb) == 0;
                     mb *= 2) {
                    Simulated s;
                    try {
                        if (extrapolate_blocks) {
                            const Simulated a = simulate(model_variant(model_text, 2, mb), name, plan, repeat_fqn, 2);
                            const Simulated b = simulate(model_variant(model_text, 3, mb), name, plan, repeat_fqn, 3);
                            s = extrapolate(a, b, static_cast<double>(layers - 2));
                        } else {
                            s = simulate(model_variant(model_text, 0, mb), name, plan);
                        }
                    } catch (const InputError& e) {
                        refused = without_location(e.what());
                        break;
                    }
                    ++evaluated;
                    Candidate cand;
                    cand.choice = c, cand.microbatches = static_cast<int>(mb), cand.plan_text = plan_text, cand.extrapolated = extrapolate_blocks;
                    cand.model_microbatches = static_cast<int>(full.gradient_accumulation);
                    cand.prefetch = c.dp_mode == "fully_shard" && c.dp > 1 ? block_unsharded / c.tp : 0;
                    cand.peak = static_cast<double>(s.memory.peak) + cand.prefetch;
                    if (least_mb == 0 || cand.peak < least) least = cand.peak, least_mb = static_cast<int>(mb);
                    if (cand.peak > r.memory_cap) continue;
                    cand.time = predict_step_time(s.work, s.comm, plan, cluster, r.compute);
                    cand.mfu = mfu(cand.time, cluster, r.compute);
                    std::lock_guard<std::mutex> lock(mu);
                    r.fitting.push_back(cand);
                    fitted = true;
                    break;
                }
                if (!fitted) {
                    std::lock_guard<std::mutex> lock(mu);
                    if (!refused.empty()) r.rejected.push_back({shape, refused});
                    else if (least_mb == 0) r.rejected.push_back({shape, fmt::format("the batch's {} rows do not split into microbatches", rows)});
                    else
                        r.rejected.push_back({shape, fmt::format("needs {} > {} per GPU (at best, with {} microbatch{})", gib(least),
                                                                 gib(r.memory_cap), least_mb, least_mb == 1 ? "" : "es")});
                }
            } catch (...) {
                std::lock_guard<std::mutex> lock(mu);
                if (!error) error = std::current_exception();
            }
        }
    };
    const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < std::min<size_t>(threads, groups.size()); ++k) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
    r.evaluated = evaluated;
    std::sort(r.fitting.begin(), r.fitting.end(), [](const Candidate& a, const Candidate& b) {
        if (a.time.step != b.time.step) return a.time.step < b.time.step;
        return a.peak < b.peak;
    });
    return r;
}

}  // namespace ptool
