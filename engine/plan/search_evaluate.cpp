// A candidate's evaluation (plan/search_state.h): simulated on meta tensors (extrapolated over the
// repeat from 4 and 5 blocks), its microbatches doubled until it fits, or a pipeline sampled and
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
// block 0 -> "first"; a block between them -> "" (left to the overall peak's line, which from
// kSampled blocks on grows by a block's saved tensors: search_state.h).
std::string block_phase(const std::string& label, const std::string& repeat, int64_t count) {
    if (label.rfind(repeat + ".", 0) != 0) return label;
    const size_t start = repeat.size() + 1, end = label.find_first_of("./", start);
    const int64_t index = std::stoll(label.substr(start, end - start));
    const std::string rest = end == std::string::npos ? "" : label.substr(end);
    if (index == 0) return repeat + ".first" + rest;
    if (index == count - 1) return repeat + ".last" + rest;
    return "";
}

Simulated simulate(const YamlNode& model, const std::string& name, const Plan& plan,
                   const std::string& repeat, int64_t count) {
    RunInputs in;
    in.model_path = name;
    in.model_document = &model;
    RankSimulation s = simulate_rank(in, plan, 0, kSteadyStateSteps, !repeat.empty());
    s.memory.peak =
        s.memory.torch_peak;  // the planner fits PyTorch's allocated peak (core/framework_memory.h)
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
    // the caching allocator's excess over the peak: the samples' largest, over the extrapolated peak.
    // An estimate that ranks the candidates: the excess does grow with the blocks, unevenly (2.02 GiB
    // at 5 blocks, 8.09 at 80 for a 70B), so the listed plans are simulated whole (search_confirm.cpp)
    o.memory.reserved_peak = o.memory.peak + std::max({int64_t{0}, a.memory.reserved_peak - a.memory.peak,
                                                       b.memory.reserved_peak - b.memory.peak});
    o.memory.resident = static_cast<int64_t>(lin(a.memory.resident, b.memory.resident));
    for (int u = 0; u < kMemoryUses; ++u)
        o.memory.at_peak[u] = static_cast<int64_t>(lin(a.memory.at_peak[u], b.memory.at_peak[u]));
    o.work = work_extrapolated(a.work, b.work, k);
    o.comm = comm_extrapolated(a.comm, b.comm, k);
    return o;
}

Simulated Search::simulate_with(int64_t mb, const Plan& plan, ModelVariants& models) const {
    if (!extrapolate_) return simulate(models.at(0, mb), name_, plan);
    const Simulated a = simulate(models.at(kSampled, mb), name_, plan, repeat_, kSampled);
    const Simulated b = simulate(models.at(kSampled + 1, mb), name_, plan, repeat_, kSampled + 1);
    return extrapolate(a, b, static_cast<double>(layers_ - kSampled));
}

// The model's microbatches, doubled until the group's plan fits under the cap.
void Search::evaluate(const PlanChoice& c, Evaluated& e) const {
    if (c.pp > 1) return evaluate_pipeline(c, e);
    std::optional<Candidate>& fit = e.fit;
    std::optional<Rejection>& refusal = e.refusal;
    int& count = e.count;
    const std::string shape = flat_shape(c);
    const std::string plan_text = write_plan(tpl_, c);
    const Plan plan = load_emitted_plan(plan_text, "generated.yaml");
    const int64_t first = full_.gradient_accumulation, last = std::max<int64_t>(o_.max_microbatches, first);
    double least = 0;
    int64_t least_mb = 0;
    ModelVariants models(text_, name_);
    for (int64_t mb = first; mb <= last && rows_ % (static_cast<int64_t>(c.dp) * mb) == 0; mb *= 2) {
        Simulated s;
        try {
            s = simulate_with(mb, plan, models);
        } catch (const InputError& e) {
            refusal = Rejection{shape, e.message(), RejectionKind::refused};
            return;
        }
        ++count;
        if (mb == first) {  // the fewest microbatches: the largest GEMMs, the fewest calls
            const StepTime t = predict_step_time(s.work, s.comm, plan, cluster_, r_.compute);
            const auto tp = c.tp > 1 ? t.by_dim.find(plan.dims.name(DimRole::tp)) : t.by_dim.end();
            e.busy = (tp != t.by_dim.end() ? tp->second.seconds : 0.0);
            for (double x : t.terms.gemm) e.busy += x;
            for (double x : t.terms.attention) e.busy += x;
        }
        Candidate cand;
        cand.choice = c, cand.microbatches = static_cast<int>(mb),
        cand.model_microbatches = static_cast<int>(first);
        // the plan carries the microbatches it was chosen with where they are not the model's
        if (mb != first) cand.choice.gradient_accumulation = static_cast<int>(mb);
        cand.plan_text = mb == first ? plan_text : write_plan(tpl_, cand.choice);
        cand.extrapolated = extrapolate_;
        // PyTorch's allocated and reserved peaks (FSDP2's prefetch is simulated), with its cuBLAS
        // workspaces, which its caching allocator holds
        cand.peak = static_cast<double>(s.memory.peak) + workspaces();
        cand.reserved = static_cast<double>(std::max(s.memory.peak, s.memory.reserved_peak)) + workspaces();
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
// sampled at 4 and 5 blocks per stage, stages balanced by their predicted time, the step the
// schedule's critical path (plan/pipeline_search.h).
void Search::evaluate_pipeline(const PlanChoice& base, Evaluated& e) const {
    std::optional<Candidate>& fit = e.fit;
    std::optional<Rejection>& refusal = e.refusal;
    int& count = e.count;
    const std::string shape = pipeline_shape(base);
    const int64_t rounds = full_.gradient_accumulation, per_round = rows_ / base.dp / rounds;
    const int m = pipeline_microbatches(base);
    if (base.schedule == ScheduleKind::dualpipev && m > 0 && m < 2 * base.pp) {  // torch's rule
        refusal = Rejection{
            shape,
            fmt::format("dualpipev needs 2 pp = {} microbatches a round, the rows give {}", 2 * base.pp, m),
            RejectionKind::indivisible};
        return;
    }
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

// The pipeline's candidate from its sampled costs: stages balanced by predicted time, the step
// the schedule's critical path; a refusal where its worst rank is over the GPU's memory.
void Search::pipeline_candidate(const PlanChoice& base, int m, const PipelineCosts& pc,
                                std::optional<Candidate>& fit, std::optional<Rejection>& refusal) const {
    const std::string shape = pipeline_shape(base);
    const int64_t rounds = full_.gradient_accumulation;
    const int stages = base.pp * base.virtual_stages;
    const PipelineSample(&at)[2] = pc.at;
    const ScheduleKind kind = base.schedule;
    const int sampled = pipeline_samples(base, m);
    const double workspace = workspaces(), fragmentation = pc.fragmentation;  // PyTorch's cuBLAS workspaces
    // a stage's forward and backward of every microbatch: its fixed part and one block's
    std::vector<double> t2(stages), t3(stages);
    for (int s = 0; s < stages; ++s)
        t2[s] = at[0].forward[s] + at[0].backward[s], t3[s] = at[1].forward[s] + at[1].backward[s];
    const int mid = stages > 2 ? 1 : 0;
    const double per_block = std::max(0.0, t3[mid] - t2[mid]);
    std::vector<double> extra(stages);
    for (int s = 0; s < stages; ++s) extra[s] = t2[s] - kStageSampled * per_block;
    PlanChoice c = base;
    c.pp_microbatches = m;
    c.stage_blocks = balance_blocks(static_cast<int>(layers_), extra, per_block);
    const PipelineSample costs = extrapolate_pipeline(at[0], at[1], c.stage_blocks, c.pp);
    Candidate cand;
    cand.choice = c, cand.microbatches = static_cast<int>(rounds),
    cand.model_microbatches = static_cast<int>(rounds);
    cand.plan_text = write_plan(tpl_, c), cand.extrapolated = true;
    const auto worst = std::max_element(costs.peak.begin(), costs.peak.end());
    cand.peak = *worst + workspace;  // with PyTorch's cuBLAS workspaces
    cand.reserved = *worst + fragmentation + workspace;
    const Plan written = load_emitted_plan(cand.plan_text, "generated.yaml");
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
    CommByOpDim comm = costs.tail_comm;  // pp rank 0's; its forwards' and backwards' m / sampled as often
    for (const auto& [key, t] : costs.fb_comm)
        comm[key].calls += t.calls * m / sampled, comm[key].bytes += t.bytes * m / sampled;
    add_comm_time(cand.time, comm, written, cluster_);  // by_dim (the step is the critical path's)
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
