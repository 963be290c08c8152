#include "plan/search.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/parallel_for.h"
#include "model/routed_experts.h"
#include "plan/device_overheads.h"
#include "plan/search_state.h"

namespace ptool::searching {

Search::Search(const std::string& model_text, const std::string& name, const Cluster& cluster,
               const SearchOptions& o)
    : text_(model_text), name_(name), cluster_(cluster), o_(o), full_(load_meta(model_text, name)) {
    r_.world_size = o.world_size > 0 ? o.world_size : cluster.world_size();
    r_.memory_cap = o.memory_cap > 0 ? o.memory_cap : cluster.memory_bytes - cluster.reserved_bytes;
    r_.compute = o.param_dtype ? parse_dtype(*o.param_dtype) : full_.dtype;
    r_.float8 = o.float8;
    if (o.float8 != Float8Search::never && !cluster.has_float8())
        throw InputError(fmt::format("--float8 {}: {}", float8_search_name(o.float8), cluster.no_float8()));
    // the plans it writes must run (train/run.cpp apply_float8): verify refused them after the search
    if (o.float8 != Float8Search::never && r_.compute != DType::float32 && r_.compute != DType::bfloat16)
        throw InputError(
            fmt::format("--float8 {} with {} compute: float8 linears compute in float32 or "
                        "bfloat16 (docs/float8.md); --mixed-precision bfloat16, or no --float8",
                        float8_search_name(o.float8), dtype_name(r_.compute)));
    if (r_.world_size > cluster.world_size())
        throw InputError(fmt::format("--world-size {} is more than {}'s {} GPUs", r_.world_size, cluster.name,
                                     cluster.world_size()));
    tpl_ = plan_template(full_);
    r_.tp_unsupported = tpl_.tp.unsupported;
    for (const auto& [fqn, m] : named_modules(*full_.root))
        if (const RoutedExperts* moe = m->routed_experts()) experts_.emplace_back(fqn, moe->experts());
    int long_repeats = 0;
    int64_t block_params = 0;  // the largest repeat element's parameter elements
    for_each_module(*full_.root, [&](const std::string& fqn, Module& m) {
        if (m.chaining() != Chaining::repeat || m.children().empty()) return;
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

namespace {

// the search's order: the faster step first, then the smaller peak
bool faster(const Candidate& a, const Candidate& b) {
    if (a.time.step != b.time.step) return a.time.step < b.time.step;
    return a.peak < b.peak;
}

}  // namespace

// The dp x tp groups first, then the pipelines that could still rank among the o_.keep fastest:
// a pipeline's busiest rank spends at least what the dp x tp rank of its tp and checkpointing with
// dp x pp data ranks spends on its GEMMs, fused attention and tp collectives at the model's own
// microbatches (Evaluated::busy: the same FLOPs and tp bytes over the same ranks, in GEMMs as large
// or larger and calls as few or fewer), whether that plan fits or not, stretched by the bubble of
// uniform stages, (p - 1) / (v m); one whose bound is slower than the keep-th fastest plan is
// not simulated (a rejection says so). With fewer fitting plans than that, every pipeline is.
// The listed plans are simulated whole (confirm_listed, search_confirm.cpp): the dp x tp ones
// before the pipelines are weighed against them, the rest at the end.
SearchResult Search::run() {
    std::vector<PlanChoice> flat, piped;
    for (PlanChoice& c : meshes()) (c.pp > 1 ? piped : flat).push_back(std::move(c));
    check_cost(flat, o_.pipelines == "never" ? std::vector<PlanChoice>{} : piped);  // never: none simulated
    evaluate_flat(flat);
    // the dp x tp plans listed confirmed whole before the pipelines are weighed against them: one
    // that does not fit whole must not keep the pipelines out
    std::stable_sort(r_.fitting.begin(), r_.fitting.end(), faster);
    confirm_listed();
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
        double compute = 0;  // the least busy dp x tp rank over the same ranks (fitting or not)
        for (const auto& [f, busy] : flat_busy_)
            if (f.cp == 1 && f.tp == c.tp && f.dp == c.dp * c.pp && f.ep == c.ep && f.same_checkpointing(c) &&
                f.float8 == c.float8 && f.param_dtype == c.param_dtype && (compute == 0 || busy < compute))
                compute = busy;
        const int m = pipeline_microbatches(c);
        // (a split backward fills its bubble with Ws: its compute alone bounds it)
        const double bubble = splits_backward(c.schedule)
                                  ? 0.0
                                  : static_cast<double>(c.pp - 1) / (c.virtual_stages * std::max(m, 1));
        const double bound = compute * (1 + bubble);
        if (kept > 0 && compute > 0 && m > 0 && bound > kept) {
            r_.rejected.push_back(
                {pipeline_shape(c),
                 fmt::format(
                     "at least {:.2f} s a step (dp={} x tp={}'s compute and tp collectives, and a bubble "
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
                r_.rejected.push_back({pipeline_shape(c),
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
        for (size_t i = before; i < r_.fitting.size(); ++i) fits[pipeline_shape(r_.fitting[i].choice)] = true;
        worth = std::move(later);
    }
    std::stable_sort(r_.fitting.begin(), r_.fitting.end(), faster);
    confirm_listed();
    return std::move(r_);
}

void Search::check_cost(const std::vector<PlanChoice>& flat, const std::vector<PlanChoice>& piped) const {
    const double total = static_cast<double>(modules_under(*full_.root));
    double block = 0;  // the extrapolated repeat's block
    if (extrapolate_)
        for_each_module(*full_.root, [&](const std::string& fqn, Module& m) {
            if (fqn == repeat_) block = static_cast<double>(modules_under(*m.children().front().second));
        });
    const double other = total - block * static_cast<double>(layers_);
    auto run_units = [&](double modules, double microbatches) {  // a variant simulated kSteadyStateSteps
        return modules * (kBuildWeight + static_cast<double>(kSteadyStateSteps) * microbatches);
    };
    double work = 0;
    const double first = static_cast<double>(std::max<int64_t>(1, full_.gradient_accumulation));
    for (const PlanChoice& c : flat) {
        (void)c;
        for (double mb = first; mb <= std::max<double>(o_.max_microbatches, first); mb *= 2)
            work +=
                extrapolate_ ? run_units(2 * other + (2 * kSampled + 1) * block, mb) : run_units(total, mb);
    }
    for (const PlanChoice& c : piped) {
        const double stages = std::min(c.pp, 4) * c.virtual_stages,
                     blocks = std::min<double>(static_cast<double>(layers_), (kStageSampled + 1) * stages),
                     variant = extrapolate_ ? other + blocks * block : total;
        work += 2 * 2 * run_units(variant / std::min(c.pp, 4), 4 * stages);  // 2 sizes, 2 samples
    }
    if (work <= static_cast<double>(kPlanWork)) return;
    throw InputError(fmt::format(
        "plan would simulate {} candidate meshes of a model of {:.0f} modules ({:.0f} a block of "
        "'{}'): about {:.3g} units of work (a module built counts {}, its forward and backward of "
        "one microbatch 1), over ptool's bound of {}: plan a proxy of the model with fewer experts "
        "or smaller blocks (ptool shrink), fewer GPUs (--world-size), or --pipeline never{}",
        flat.size() + piped.size(), total, block, repeat_, work, kBuildWeight, kPlanWork,
        o_.float8 == Float8Search::offer
            ? " (--float8 offer simulates each candidate twice: --float8 tensorwise once)"
            : ""));
}

// The dp x tp groups, fully_shard's first: a group that holds whole parameters (replicate,
// ZeRO-1/2) or shards them over fewer ranks (HSDP) needs at least what fully_shard over the same
// dp, tp and checkpointing needs at every microbatch count, where a block is at most a quarter
// of the parameters (a repeat of 4 or more: fully_shard's transients are a gathered unit, its
// prefetch and its unsharded gradients, 3 blocks, against the parameters and gradients the
// others hold whole). Where fully_shard does not fit, neither do they: not simulated.
void Search::evaluate_flat(std::vector<PlanChoice> groups) {
    auto lightest = [](const PlanChoice& c) {
        return c.dp_mode == DataParallelMode::fully_shard && !c.hybrid();
    };
    auto sibling = [&](const PlanChoice& c) {
        return fmt::format("dp={} x tp={}{}{}", c.dp, c.tp, checkpointed(c), c.float8_text());
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
            {fmt::format("dp={} x tp={} {}{}{}", c.dp, c.tp, c.mode_name(), checkpointed(c), c.float8_text()),
             fmt::format("does not fit where dp={} x tp={} fully_shard{}{} does not: not "
                         "simulated",
                         c.dp, c.tp, checkpointed(c), c.float8_text()),
             RejectionKind::memory_implied});
    }
    evaluate_all(worth);
}

void Search::evaluate_all(const std::vector<PlanChoice>& groups) {
    std::vector<Evaluated> out(groups.size());
    // the longest first (a pipeline's samples run its microbatches on v stages a rank), so that
    // no thread is left with a long one at the end
    std::vector<size_t> order(groups.size());
    std::iota(order.begin(), order.end(), size_t{0});
    auto cost = [&](const PlanChoice& c) {
        return c.pp > 1 ? static_cast<int64_t>(pipeline_microbatches(c)) * c.virtual_stages * c.virtual_stages
                        : 0;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return cost(groups[a]) > cost(groups[b]); });
    parallel_for(groups.size(), o_.threads, [&](size_t k) {
        const size_t i = order[k];
        evaluate(groups[i], out[i]);
    });
    for (size_t i = 0; i < groups.size(); ++i) {  // in group order: the same output on any thread count
        if (out[i].fit) r_.fitting.push_back(std::move(*out[i].fit));
        if (out[i].refusal) r_.rejected.push_back(std::move(*out[i].refusal));
        r_.evaluated += out[i].count;
        if (groups[i].pp == 1 && out[i].busy > 0) flat_busy_.emplace_back(groups[i], out[i].busy);
    }
}

// The variants of pipeline `c` (the same pp, dp and tp) that need no more memory than it:
// fully_shard where it replicates (shards of the parameters, gradients and optimizer state, not
// the whole), checkpointed where it is not (a block's activations recomputed, not kept), 1F1B
// where it interleaves (pp rank r holds at most pp - r stages' activations of microbatches in
// flight; interleaved's warm-up ((v + 1) pp - 2 r - 1) / v of them, (pp + (v - 2) r - 1) / v more)
// or splits its backward (a W holds its microbatch's linear inputs and output gradients past its I).
std::vector<PlanChoice> Search::lighter_variants(const PlanChoice& c) const {
    std::vector<PlanChoice> out;
    if (c.dp_mode == DataParallelMode::replicate)
        out.push_back(c), out.back().dp_mode = DataParallelMode::fully_shard;
    if (!c.checkpoint && !tpl_.blocks.empty())  // the op policy keeps less than no checkpointing
        out.push_back(c), out.back().checkpoint = true, out.back().selective = true;
    if (c.selective) out.push_back(c), out.back().selective = false;  // and full less than the op policy
    if (c.virtual_stages > 1 || splits_backward(c.schedule))          // (zero_bubble: its Ws hold more)
        out.push_back(c), out.back().schedule = ScheduleKind::one_f_one_b, out.back().virtual_stages = 1;
    return out;
}

}  // namespace ptool::searching

namespace ptool {

// --float8's names, in Float8Search's order
constexpr const char* kFloat8SearchNames[] = {"never", "tensorwise", "rowwise", "offer"};

const char* float8_search_name(Float8Search s) {
    return kFloat8SearchNames[static_cast<int>(s)];
}

std::vector<std::string> float8_search_names() {
    return {std::begin(kFloat8SearchNames), std::end(kFloat8SearchNames)};
}

std::optional<Float8Search> float8_search_named(const std::string& name) {
    for (size_t i = 0; i < std::size(kFloat8SearchNames); ++i)
        if (name == kFloat8SearchNames[i]) return static_cast<Float8Search>(i);
    return std::nullopt;
}

SearchResult search_plans(const std::string& model_text, const std::string& name, const Cluster& cluster,
                          const SearchOptions& o) {
    return searching::Search(model_text, name, cluster, o).run();
}

}  // namespace ptool
