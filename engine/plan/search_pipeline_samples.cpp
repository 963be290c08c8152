// A pipeline candidate's costs, sampled (plan/search_state.h): the plan's pipeline simulated rank by
// rank at 4 and 5 blocks a stage, with the fewest microbatches that reach the schedule's steady
// state; past 4 pp ranks, pipelines of 3 and 4 ranks widened to the plan's (widen_pipeline).
#include <map>
#include <tuple>

#include "plan/search_state.h"
#include "plan/shrink.h"

namespace ptool::searching {

// One pipeline's samples: the plans and models of P pp ranks with stages of k blocks each, and one
// rank's simulation of them, each built and simulated once.
class Search::PipelineSampler {
public:
    PipelineSampler(const Search& s, const PlanChoice& base, int m, int& count)
        : s_(s),
          base_(base),
          m_(m),
          count_(count),
          v_(base.virtual_stages),
          stages_(base.pp * base.virtual_stages),
          // Sampled with the fewest microbatches that reach the schedule's steady state, each of the
          // same rows: a 1F1B stage holds min(pp - s, m) of them at once, so its peak, its
          // per-microbatch costs and its tail are the same, and the simulation costs m_min / m of it.
          // (interleaved's warm-up runs up to (v - 1) pp + 2 (pp - 1) forwards on rank 0, then its
          // steady state adds one before each backward: 2 pp microbatches reach it, pp do not)
          sampled_(pipeline_samples(base, m)),
          per_pp_rank_(s.r_.world_size / base.pp),
          workspace_(s.workspaces()),
          // Past 4 pp ranks the samples are pipelines of 3 and 4 ranks (the same dp, tp and stages of
          // k blocks) widened to pp (widen_pipeline): a rank's microbatches in flight grow linearly
          // with pp, and the simulations no longer do.
          widened_(base.pp > 4),
          models_(s.text_, s.name_) {
        // widened samples are timed on the links of the plan itself: its pp ranks may span nodes
        // where P ranks do not
        if (widened_) {
            PlanChoice real = base;
            real.pp_microbatches = sampled_, real.stage_blocks.assign(stages_, kStageSampled);
            timing_ = load_emitted_plan(write_plan(s.tpl_, real), "generated.yaml");
        }
    }

    PipelineCosts costs() {
        // a middle rank first (its stages the longest), then the last and the first: each one's line
        // before the other ranks are simulated
        if (base_.pp >= 3) check_rank(1);
        check_rank(base_.pp - 1);
        check_rank(0);
        for (int k : {kStageSampled, kStageSampled + 1})
            out_.at[k - kStageSampled] =
                widened_ ? widen_pipeline(sample_at(3, k), sample_at(4, k), base_.pp, v_ == 1 ? m_ : base_.pp)
                         : sample_at(base_.pp, k);
        return out_;
    }

private:
    using Key = std::tuple<int, int, int>;

    // P ranks run microbatches in the same ratio to their ranks as the plan's samples: 1 or 2
    int sampled_at(int P) const { return P * (sampled_ / base_.pp) + sampled_ % base_.pp; }

    // The plan and model that pp rank `holder` of P is simulated with at k blocks a stage: its stages
    // k blocks each, the others one (sampled_stage_blocks). Its mesh, schedule, stages and
    // microbatches are every holder's: the plan of holder 0 serves where only they are read (the
    // samples' placement and timing, the memory cap).
    struct Variant {
        Plan plan;
        int64_t blocks, rows;  // the model's (model_of)
    };
    // The variant's model: the document with its blocks and rows, at the model's microbatches.
    const YamlNode& model_of(const Variant& v) {
        return models_.at(v.blocks, s_.full_.gradient_accumulation, v.rows);
    }
    const Variant& variant(int P, int k, int microbatches, int holder) {
        const auto key = std::make_tuple(P, k, microbatches, holder);
        if (auto it = variants_.find(key); it != variants_.end()) return it->second;
        PlanChoice c = base_;
        c.pp = P, c.pp_microbatches = microbatches;
        c.stage_blocks = sampled_stage_blocks(stage_placement(base_.schedule, P, P * v_), holder, k);
        int64_t blocks = 0;
        for (int b : c.stage_blocks) blocks += b;
        return variants_
            .emplace(key, Variant{load_emitted_plan(write_plan(s_.tpl_, c), "generated.yaml"), blocks,
                                  s_.rows_ / m_ * microbatches})
            .first->second;
    }

    RankSimulation simulate_at(int P, int k, int rank) {
        if (auto it = simulated_.find({P, k, rank}); it != simulated_.end()) return std::move(it->second);
        const int own = sampled_at(P), pp_rank = rank / per_pp_rank_;
        const Variant& v = variant(P, k, own, pp_rank);
        const Plan& plan = v.plan;
        RunInputs in;
        in.model_path = s_.name_, in.model_document = &model_of(v);
        ++count_;
        RankSimulation sim = simulate_rank(in, plan, rank, kSteadyStateSteps, true);
        sim.memory.peak = sim.memory.torch_peak;  // PyTorch's allocated peak
        // the caching allocator's excess over the tensors' peak (as extrapolate's)
        out_.fragmentation =
            std::max(out_.fragmentation, static_cast<double>(sim.memory.reserved_peak - sim.memory.peak));
        // every stage holds 2 blocks or more when the blocks are at least twice the stages, and
        // a rank's microbatches in flight and the last rank's outputs only grow with pp and the
        // microbatches: a rank over the cap here is over it in the plan (the others not simulated)
        if (k == kStageSampled && s_.layers_ >= kStageSampled * stages_ &&
            static_cast<double>(sim.memory.peak) + workspace_ > s_.cap(plan))
            throw OverCap{fmt::format(
                "pp rank {} needs more than {} > {} per GPU with {} blocks a stage ({} microbatches a "
                "round)",
                pp_rank == P - 1 ? base_.pp - 1 : pp_rank,
                gib(static_cast<double>(sim.memory.peak) + workspace_), gib(s_.cap(plan)), kStageSampled,
                m_)};
        // the rank that holds the last stage (the V's: rank 0)
        const bool last = stage_placement(base_.schedule, P, P * v_).back() == pp_rank;
        if (last && m_ > sampled_ && !(widened_ && v_ == 1))  // (widened 1F1B: widen_pipeline)
            grow_last_stage(sim, in, P, k, rank);
        return sim;
    }

    // The last stage keeps every microbatch's output for the step (StepOutput): its peak grows with
    // the count, linearly from the sample at twice as many, by the m - sampled microbatches the plan
    // runs beyond its samples.
    void grow_last_stage(RankSimulation& sim, const RunInputs& in, int P, int k, int rank) {
        const int own = sampled_at(P);
        const Variant& v = variant(P, k, 2 * own, rank / per_pp_rank_);
        RunInputs in2 = in;
        in2.model_document = &model_of(v);
        ++count_;
        RankSimulation twice = simulate_rank(in2, v.plan, rank, kSteadyStateSteps, true);
        twice.memory.peak = twice.memory.torch_peak;
        const double f = static_cast<double>(m_ - sampled_) / own;
        auto lin = [f](int64_t x, int64_t y) { return static_cast<int64_t>(x + (y - x) * f); };
        sim.memory.peak = lin(sim.memory.peak, twice.memory.peak);
        for (auto& [label, peak] : sim.phase_peaks)
            if (auto it = twice.phase_peaks.find(label); it != twice.phase_peaks.end())
                peak = lin(peak, it->second);
    }

    PipelineSample sample_at(int P, int k) {
        return sample_pipeline(
            variant(P, k, sampled_at(P), 0).plan, s_.cluster_, s_.r_.compute, s_.repeat_, k,
            [&](int rank) { return simulate_at(P, k, rank); }, timing_ ? &*timing_ : nullptr);
    }

    // pp rank `q` of P's peak at k blocks a stage, its simulation kept for the samples (sample_at
    // simulates pp rank q as the global rank q x the ranks of a pp rank: pp is the outer dim)
    double peak_kept(int P, int k, int q) {
        const int rank = q * per_pp_rank_;
        RankSimulation sim = simulate_at(P, k, rank);
        const double peak = static_cast<double>(sim.memory.peak);
        simulated_.insert_or_assign(std::make_tuple(P, k, rank), std::move(sim));
        return peak;
    }

    // pp rank `q`'s peak (0, 1 for every middle rank, or the last) at k blocks a stage, as the samples
    // carry it: its own sample, or widen_pipeline's line from 3 and 4 ranks to the plan's pp (the last
    // rank's outputs, under 1F1B, to its m), its simulations kept for the samples.
    double rank_peak(int k, int q) {
        const int last = base_.pp - 1;
        if (!widened_) return peak_kept(base_.pp, k, q);
        const double at = q == last ? (v_ == 1 ? m_ : base_.pp) - 3 : base_.pp - 3;
        const double p3 = peak_kept(3, k, q == last ? 2 : q), p4 = peak_kept(4, k, q == last ? 3 : q);
        return p3 + (p4 - p3) * at;
    }

    // pp rank q's peak before the other ranks are simulated: its samples at 4 and 5 blocks make the
    // line extrapolate_pipeline takes its peak on (each module pass's peak is linear in the blocks, the
    // rank's blocks a mean of its stages'), read at the fewest and the most blocks its stages can get:
    // a middle rank's at least layers / stages (the first and the last stage are cut shorter), any
    // other's the least balance_blocks gives a stage; the most, what the other stages' least leaves.
    // The lower end is at most the peak the plan's own check takes for that rank (its peak plus the
    // allocator's excess and the workspaces); over the cap, the plan is too (OverCap).
    void check_rank(int q) {
        const int last = base_.pp - 1;
        const bool middle = q > 0 && q < last;
        double at_k[2];
        for (int k : {kStageSampled, kStageSampled + 1}) at_k[k - kStageSampled] = rank_peak(k, q);
        const int64_t least = least_stage_blocks(static_cast<int>(s_.layers_), stages_),
                      fewest = middle ? s_.layers_ / stages_ : least,
                      most = s_.layers_ - (stages_ - 1) * least;
        auto at = [&](int64_t blocks) {
            return at_k[0] + (at_k[1] - at_k[0]) * static_cast<double>(blocks - kStageSampled);
        };
        const double lower = std::min(at(fewest), at(most)) + workspace_;
        // the plan's communicators: widened, the timing plan's (the plan's mesh)
        const Plan& plan =
            widened_ ? *timing_ : variant(base_.pp, kStageSampled, sampled_at(base_.pp), 0).plan;
        const double c = s_.cap(plan);
        if (lower <= c) return;
        if (middle)
            throw OverCap{fmt::format(
                "pp rank {} needs more than {} > {} per GPU with {} blocks a stage, as every middle rank ({} "
                "microbatches a round)",
                q, gib(lower), gib(c), fewest, m_)};
        throw OverCap{
            fmt::format("pp rank {} needs more than {} > {} per GPU with {} to {} blocks in its stage{} "
                        "({} microbatches a round)",
                        q, gib(lower), gib(c), fewest, most, v_ > 1 ? "s" : "", m_)};
    }

    const Search& s_;
    const PlanChoice& base_;
    const int m_;
    int& count_;  // the simulations run
    const int v_, stages_, sampled_, per_pp_rank_;
    const double workspace_;  // PyTorch's cuBLAS workspaces, in its allocator
    const bool widened_;
    std::map<std::tuple<int, int, int, int>, Variant> variants_;
    ModelVariants models_;  // the model's document, each simulation's variant set in it
    std::map<Key, RankSimulation> simulated_;
    std::optional<Plan> timing_;
    PipelineCosts out_;
};

// A pipeline's costs sampled at 4 and 5 blocks a stage (OverCap: a rank over the GPU's memory).
Search::PipelineCosts Search::sample_pipeline_costs(const PlanChoice& base, int m, int& count) const {
    return PipelineSampler(*this, base, m, count).costs();
}

}  // namespace ptool::searching
