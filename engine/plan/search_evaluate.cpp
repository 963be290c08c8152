// A candidate's evaluation (plan/search_state.h): simulated on meta tensors (extrapolated over the
// repeat from 2 and 3 blocks), its microbatches doubled until it fits, or a pipeline sampled and
// its stages balanced.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"
#include "plan/device_overheads.h"
#include "plan/search_state.h"
#include "plan/shrink.h"

namespace ptool::searching {

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
                   const std::string& repeat, int64_t count) {
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

Simulated Search::simulate_with(int64_t mb, const Plan& plan) const {
    if (!extrapolate_) return simulate(model_variant(text_, 0, mb), name_, plan);
    const Simulated a = simulate(model_variant(text_, 2, mb), name_, plan, repeat_, 2);
    const Simulated b = simulate(model_variant(text_, 3, mb), name_, plan, repeat_, 3);
    return extrapolate(a, b, static_cast<double>(layers_ - 2));
}

// The model's microbatches, doubled until the group's plan fits under the cap.
void Search::evaluate(const PlanChoice& c, std::optional<Candidate>& fit, std::optional<Rejection>& refusal,
                      int& count) const {
    if (c.pp > 1) return evaluate_pipeline(c, fit, refusal, count);
    const std::string dp =
        c.hybrid() ? fmt::format("{}x{}", c.dp_replicate(), c.dp_shard) : std::to_string(c.dp);
    const std::string shape =
        fmt::format("dp={}{} x tp={} {}{}", dp, c.cp > 1 ? fmt::format(" x cp={}", c.cp) : "", c.tp,
                    c.mode_name(), checkpointed(c));
    const std::string plan_text = write_plan(full_, tpl_, c);
    const Plan plan = load_plan_text(plan_text, "generated.yaml");
    const int64_t first = full_.gradient_accumulation, last = std::max<int64_t>(o_.max_microbatches, first);
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
        cand.prefetch = c.dp_mode == DataParallelMode::fully_shard && c.dp > 1 ? block_unsharded_ / c.tp : 0;
        cand.peak = static_cast<double>(s.memory.peak) + cand.prefetch;
        cand.reserved = static_cast<double>(std::max(s.memory.peak, s.memory.reserved_peak)) + cand.prefetch;
        if (least_mb == 0 || cand.reserved < least) least = cand.reserved, least_mb = mb;
        if (cand.reserved > cap(plan)) continue;
        cand.runtime = runtime(plan);
        cand.time = predict_step_time(s.work, s.comm, plan, cluster_, r_.compute);
        cand.mfu = mfu(cand.time, cluster_, r_.compute);
        fit = std::move(cand);
        return;
    }
    if (least_mb == 0)
        refusal = Rejection{shape, fmt::format("the batch's {} rows do not split into microbatches", rows_),
                            RejectionKind::indivisible};
    else
        refusal = Rejection{shape,
                            fmt::format("needs {} > {} per GPU (at best, with {} microbatch{})", gib(least),
                                        gib(cap(plan)), least_mb, least_mb == 1 ? "" : "es"),
                            RejectionKind::memory};
}

// A pipeline: its microbatches per round the most the rows allow (a power of two times pp: the
// smallest bubble and the least held at once, microbatches of one row as torchtitan's default),
// sampled at 2 and 3 blocks per stage, stages balanced by their predicted time, the step the
// schedule's critical path (plan/pipeline_search.h).
void Search::evaluate_pipeline(const PlanChoice& base, std::optional<Candidate>& fit,
                               std::optional<Rejection>& refusal, int& count) const {
    const std::string shape = pipeline_shape(base);
    const int64_t rounds = full_.gradient_accumulation, per_round = rows_ / base.dp / rounds;
    const int m = pipeline_microbatches(base);
    if (m == 0) {
        refusal = Rejection{
            shape,
            fmt::format("{} rows per dp rank and round do not cut into {} microbatches", per_round, base.pp),
            RejectionKind::indivisible};
        return;
    }
    PipelineCosts sampled;
    try {
        sampled = sample_pipeline_costs(base, m, count);
    } catch (const OverCap& e) {
        refusal = Rejection{shape, e.message, RejectionKind::memory};
        return;
    } catch (const InputError& e) {
        refusal = Rejection{shape, e.message(), RejectionKind::refused};
        return;
    }
    pipeline_candidate(base, m, sampled, fit, refusal);
}

// A pipeline's costs sampled at 2 and 3 blocks a stage (OverCap: a rank over the GPU's memory).
Search::PipelineCosts Search::sample_pipeline_costs(const PlanChoice& base, int m, int& count) const {
    const int64_t rounds = full_.gradient_accumulation;
    const int stages = base.pp * base.virtual_stages;
    // Sampled with the fewest microbatches that reach the schedule's steady state, each of the
    // same rows: a 1F1B stage holds min(pp - s, m) of them at once, so its peak, its
    // per-microbatch costs and its tail are the same, and the simulation costs m_min / m of it.
    // (interleaved's warm-up runs up to (v - 1) pp + 2 (pp - 1) forwards on rank 0, then its
    // steady state adds one before each backward: 2 pp microbatches reach it, pp do not)
    const int v = base.virtual_stages;
    const int sampled = pipeline_samples(base, m);
    PipelineCosts out;
    PipelineSample(&at)[2] = out.at;
    const double prefetch = pipeline_prefetch(base);
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
    double& fragmentation = out.fragmentation;  // the samples' largest reserved - peak
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
        if (k == 2 && layers_ >= 2 * stages && static_cast<double>(sim.memory.peak) + prefetch > cap(plan))
            throw OverCap{fmt::format(
                "pp rank {} needs more than {} > {} per GPU with 2 blocks a stage ({} microbatches a "
                "round)",
                pp_rank == P - 1 ? base.pp - 1 : pp_rank,
                gib(static_cast<double>(sim.memory.peak) + prefetch), gib(cap(plan)), m)};
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
    {
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
            if (const double c = cap(variant(P, 2, sampled_at(P)).first); least > c)
                throw OverCap{
                    fmt::format("pp rank 1 needs more than {} > {} per GPU with {} blocks a "
                                "stage, as every middle rank ({} microbatches a round)",
                                gib(least), gib(c), x, m)};
        }
        for (int k : {2, 3})
            at[k - 2] = widened
                            ? widen_pipeline(sample_at(3, k), sample_at(4, k), base.pp, v == 1 ? m : base.pp)
                            : sample_at(base.pp, k);
    }
    return out;
}

// The pipeline's candidate from its sampled costs: stages balanced by predicted time, the step
// the schedule's critical path; a refusal where its worst rank is over the GPU's memory.
void Search::pipeline_candidate(const PlanChoice& base, int m, const PipelineCosts& pc,
                                std::optional<Candidate>& fit, std::optional<Rejection>& refusal) const {
    const std::string shape = pipeline_shape(base);
    const int64_t rounds = full_.gradient_accumulation;
    const int stages = base.pp * base.virtual_stages;
    const PipelineSample(&at)[2] = pc.at;
    const ScheduleKind kind =
        base.virtual_stages > 1 ? ScheduleKind::interleaved_one_f_one_b : ScheduleKind::one_f_one_b;
    const int sampled = pipeline_samples(base, m);
    const double prefetch = pipeline_prefetch(base), fragmentation = pc.fragmentation;
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
    for (int s = 0; s < stages; ++s) flops += (costs.forward_flops[s] + costs.backward_flops[s]) * m * rounds;
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

}  // namespace ptool::searching
