// The plan search (plan/search.h) as one object, its stages each in a file:
//   search.cpp             the search's order: the candidates, its cost bound, their evaluation
//   search_candidates.cpp  the candidates: meshes, context parallel, pipelines, the lint
//   search_evaluate.cpp    a candidate's simulation (extrapolated over the repeat), flat or a pipeline
//   search_confirm.cpp     the listed candidates simulated whole, as explain does
//   search_pipeline_samples.cpp  a pipeline's costs sampled at 4 and 5 blocks a stage
// Internal to those files.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/model.h"
#include "plan/device_overheads.h"
#include "plan/pipeline_search.h"
#include "plan/plan_writer.h"
#include "plan/search.h"
#include "plan/shrink.h"
#include "train/simulate.h"

namespace ptool::searching {

// The blocks of the repeat the planner simulates: kSampled and one more, extrapolated linearly. Not
// 2 and 3: with PyTorch's allocations tallied, a block between others holds more than the first
// and the last (FSDP2's prefetch of the block below and the reduce-scatter of the block above in
// flight), and the allocated peak grows by a block's saved tensors only from 4 blocks on
// (Llama-3-8B, dp8 x cp2, op-SAC: 2 -> 3 blocks +0.218 GB, 3 -> 4 +0.241, then +0.382 a block; from 2
// and 3 the 32 blocks' peak came out 7.5% low, from 4 and 5 it is explain's to the byte).
constexpr int64_t kSampled = 4;

inline std::string gib(double bytes) {
    return fmt::format("{:.1f} GiB", bytes / (1ull << 30));
}

struct Simulated {
    RankMemory memory;
    MetaWork work;
    CommByOpDim comm;
    std::map<std::string, int64_t> phases;  // peak per module pass, the blocks' named first/last
};

// One rank's kSteadyStateSteps steps on meta tensors (rank 0), its peaks per module pass keyed as block_phase
// says.
Simulated simulate(const YamlNode& model, const std::string& name, const Plan& plan,
                   const std::string& repeat = "", int64_t count = 0);
// a + (b - a) * k, field by field (search_evaluate.cpp).
Simulated extrapolate(const Simulated& a, const Simulated& b, double k);

// What one search knows about the model, and its two stages: the meshes (the lint, once per
// dp x tp) and each (mesh, mode, checkpointing) group's microbatches until one fits.
class Search {
public:
    Search(const std::string& model_text, const std::string& name, const Cluster& cluster,
           const SearchOptions& o);
    SearchResult run();

private:
    // The search's cost, bounded before it starts (docs/planning.md, "What plan costs"): each group
    // simulates at most a model variant per microbatch count it tries (the model's, doubled up to
    // --max-microbatches; a pipeline's samples), each building the variant's modules (16 units a
    // module, as explain's bound) and running them forward and backward per microbatch and step. A
    // variant holds the modules outside the extrapolated repeat and at most 3 of its blocks (2 and
    // 3 blocks: extrapolate), a pipeline's sample at most 3 blocks a stage of 4 pp ranks, else the
    // whole model. Past kPlanWork units: InputError naming the product and the fix.
    static constexpr int64_t kPlanWork = int64_t{1} << 24, kBuildWeight = 16;
    void check_cost(const std::vector<PlanChoice>& flat, const std::vector<PlanChoice>& piped) const;
    void evaluate_flat(std::vector<PlanChoice> groups);
    void evaluate_all(const std::vector<PlanChoice>& groups);
    std::vector<PlanChoice> lighter_variants(const PlanChoice& c) const;
    int pipeline_microbatches(const PlanChoice& c) const;

    // The repeated blocks' activation checkpointing a candidate may have: none, torchtitan's op-level
    // selective policy, full (checkpoint, selective)
    static constexpr std::pair<bool, bool> kCheckpointing[] = {{false, false}, {true, true}, {true, false}};
    // The data-parallel shapes a mesh's candidates try: fully_shard, replicate, and HSDP (fully_shard
    // over dp_replicate x dp_shard: `true`, the dp ranks of a node sharded, replicated across nodes)
    static constexpr std::pair<DataParallelMode, bool> kDataParallelShapes[] = {
        {DataParallelMode::fully_shard, false},
        {DataParallelMode::replicate, false},
        {DataParallelMode::fully_shard, true}};
    // The pipeline schedules the search offers, with their virtual stages per rank
    // (zero_bubble: torch's ScheduleInterleavedZeroBubble at one stage per rank; zbv and dualpipev
    // hold 2 in a V, searched up to kMostVRanks pp ranks: the samples of wider pipelines are widened
    // from 3 and 4 ranks in the loop placement)
    static constexpr std::pair<ScheduleKind, int> kPipelineShapes[] = {
        {ScheduleKind::one_f_one_b, 1},
        {ScheduleKind::interleaved_one_f_one_b, 2},
        {ScheduleKind::zero_bubble, 1},
        {ScheduleKind::zbv, 2},
        {ScheduleKind::dualpipev, 2}};
    static constexpr int kMostVRanks = 4;
    static std::string checkpointed(const PlanChoice& c) {
        return !c.checkpoint ? "" : c.selective ? " checkpointed (op)" : " checkpointed";
    }

    static std::string flat_shape(const PlanChoice& c) {
        const std::string dp =
            c.hybrid() ? fmt::format("{}x{}", c.dp_replicate(), c.dp_shard) : std::to_string(c.dp);
        return fmt::format("dp={}{} x tp={} {}{}{}", dp, c.cp > 1 ? fmt::format(" x cp={}", c.cp) : "", c.tp,
                           c.mode_name(), checkpointed(c), c.float8_text());
    }
    static std::string pipeline_shape(const PlanChoice& c) {
        return fmt::format("pp={} x dp={} x tp={} {} {}{}{}{}", c.pp, c.dp, c.tp, c.mode_name(),
                           schedule_kind_name(c.schedule),
                           c.virtual_stages > 1 ? fmt::format(" v{}", c.virtual_stages) : "", checkpointed(c),
                           c.float8_text());
    }

    bool rows_split(int dp, const std::string& shape);
    std::string expert_split(int ep) const;
    static Model load_meta(const std::string& text, const std::string& name) {
        MetaAllocation meta;
        return load_model_text(text, name, "", false);
    }

    std::vector<PlanChoice> meshes();
    std::vector<PlanChoice> with_float8(std::vector<PlanChoice> groups) const;  // SearchOptions::float8
    void add_context_parallel(const PlanChoice& base, std::vector<PlanChoice>& groups);
    void add_pipelines(const PlanChoice& base, std::vector<PlanChoice>& groups);
    std::string lint(PlanChoice c) const;
    // The lints meshes() asks for, run beforehand on every core (each is explain's resolution of the
    // whole model: for a 405B on 512 GPUs they were the search's serial start), by (dp, cp, tp); a
    // lint not among them runs when asked.
    void lint_ahead();
    std::map<std::tuple<int, int, int>, std::string> linted_;
    Simulated simulate_with(int64_t mb, const Plan& plan, ModelVariants& models) const;
    // What a group's evaluation found: the candidate that fits or why none does, the simulations
    // run, and for a dp x tp group its rank's seconds of compute and tensor-parallel collectives at
    // the model's own microbatches (its first simulation), fitting or not: what the busiest rank of
    // a pipeline over the same ranks spends at least (run()'s bound).
    struct Evaluated {
        std::optional<Candidate> fit;
        std::optional<Rejection> refusal;
        int count = 0;
        double busy = 0;
    };
    void evaluate(const PlanChoice& c, Evaluated& e) const;
    // every dp x tp group evaluated, with its Evaluated::busy
    std::vector<std::pair<PlanChoice, double>> flat_busy_;

    // A pipeline's costs at 4 and 5 blocks a stage (plan/pipeline_search.h) and the samples' largest
    // reserved - peak (the caching allocator's excess, as extrapolate's).
    struct PipelineCosts {
        PipelineSample at[2];
        double fragmentation = 0;
    };
    // A sampled pipeline rank over the GPU's memory (a memory rejection, not a refusal).
    struct OverCap {
        std::string message;
    };
    // The microbatches a pipeline is sampled with: the fewest that reach the schedule's steady state.
    // (a split backward's Ws wait behind its Is, torch's order reaching its steady state later: 2 pp,
    // which its rule, a multiple of microbatches / pp, admits)
    static int pipeline_samples(const PlanChoice& base, int m) {
        return std::min(
            m, base.virtual_stages > 1 || splits_backward(base.schedule) ? 2 * base.pp : base.pp + 1);
    }

    // The listed candidates simulated whole, as explain simulates a plan (search_confirm.cpp).
    void confirm_listed();
    struct Whole;
    void prepare_whole(Whole& w) const;
    void simulate_class(Whole& w, size_t k) const;
    std::optional<Rejection> finish_whole(Whole& w) const;
    // explain's steps: the model's, within the steady state's and 4
    int64_t whole_steps() const { return std::clamp<int64_t>(full_.steps, kSteadyStateSteps, 4); }
    static std::string shape_of(const PlanChoice& c) { return c.pp > 1 ? pipeline_shape(c) : flat_shape(c); }

    void evaluate_pipeline(const PlanChoice& base, Evaluated& e) const;
    class PipelineSampler;  // search_pipeline_samples.cpp
    PipelineCosts sample_pipeline_costs(const PlanChoice& base, int m, int& count) const;
    void pipeline_candidate(const PlanChoice& base, int m, const PipelineCosts& pc,
                            std::optional<Candidate>& fit, std::optional<Rejection>& refusal) const;
    const std::string& text_;
    const std::string& name_;
    // What a plan's tensors may take per GPU: the cap less the runtime's memory outside the caching
    // allocator on the plan's neediest rank (plan/device_overheads.h); --memory-cap is the tensors'
    // already. PyTorch's cuBLAS workspaces are in its allocator: counted with the tensors.
    double runtime(const Plan& plan) const {
        return o_.memory_cap > 0 ? 0 : worst_device_overheads(cluster_, plan).outside_allocator();
    }
    double workspaces() const { return kCublasWorkspaces * cluster_.runtime.cublas_workspace; }
    double cap(const Plan& plan) const { return r_.memory_cap - runtime(plan); }

    const Cluster& cluster_;
    const SearchOptions& o_;
    const Model full_;
    SearchResult r_;
    PlanTemplate tpl_;                                      // what its plans take from the model
    std::vector<std::pair<std::string, int64_t>> experts_;  // each moe layer and its experts
    int64_t layers_ = 0, rows_ = 0;
    std::string repeat_;  // the repeat extrapolated over
    bool extrapolate_ = false;
    double block_unsharded_ = 0;
};

}  // namespace ptool::searching
