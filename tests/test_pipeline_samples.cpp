// The planner's pipeline samples (plan/pipeline_search.h, sampled_stage_blocks): a pp rank
// simulated with a model and plan whose other stages hold one block each is the rank simulated with
// k blocks in every stage, but for its blocks' indices: the same memory (every peak, by use, the
// allocator's reserved), the same work and collectives, action by action, and the same module-pass
// peaks once a block's index is read as its stage's first or last. Under FSDP with checkpointing
// and under DDP, 1F1B, interleaved, ZBV, ZB-H1 and DualPipeV, on a Llama-shaped model and on GPT-2
// with its head tied to the embedding across the first and the last stage.

#include <map>
#include <string>

#include "parallel/plan.h"
#include "plan/pipeline_search.h"
#include "test_helpers.h"
#include "train/schedule.h"
#include "train/simulate.h"

using namespace ptool;

namespace test_pipeline_samples {

// "layers.7.attn_block/b" -> "s1.first.attn_block/b" where block 7 of repeat `layers` starts stage 1
// of `blocks`; a block inside a stage -> "s1.mid"; other labels as they are.
std::map<std::string, int64_t> by_stage(const std::map<std::string, int64_t>& peaks,
                                        const std::string& repeat, const std::vector<int>& blocks) {
    std::map<std::string, int64_t> out;
    const std::string prefix = repeat + ".";
    for (const auto& [label, peak] : peaks) {
        std::string key = label;
        if (label.rfind(prefix, 0) == 0) {
            const size_t end = label.find_first_of("./", prefix.size());
            const int i = std::stoi(label.substr(prefix.size(), end - prefix.size()));
            int stage = 0, first = 0;
            while (i >= first + blocks[stage]) first += blocks[stage++];
            const std::string where = i == first ? "first" : i == first + blocks[stage] - 1 ? "last" : "mid";
            key = "s" + std::to_string(stage) + "." + where +
                  (end == std::string::npos ? "" : label.substr(end));
        }
        out[key] = std::max(out[key], peak);
    }
    return out;
}

bool same(const CommByOpDim& a, const CommByOpDim& b) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, t] : a) {
        const auto it = b.find(key);
        if (it == b.end() || it->second.calls != t.calls || it->second.bytes != t.bytes) return false;
    }
    return true;
}

// A shipped model with its repeat at `blocks` blocks and 16 rows a step in one round.
struct SampledModel {
    std::string file, repeat;
    std::vector<std::pair<std::string, std::string>> edits;  // besides the repeat's count
    std::string text(int blocks) const {
        std::string t = read_text(std::string(PTOOL_SOURCE_DIR) + "/models/" + file);
        std::vector<std::pair<std::string, std::string>> all = edits;
        all.emplace_back("count: 2", "count: " + std::to_string(blocks));
        for (const auto& [from, to] : all) {
            const size_t at = t.find(from);
            REQUIRE(at != std::string::npos);
            t.replace(at, from.size(), to);
        }
        return t;
    }
};

// A pp 4 x dp 2 plan cutting `repeat` into stages of `blocks`: FSDP2 on every block with every
// block checkpointed, or DDP without checkpointing.
std::string plan_text(const std::string& repeat, bool fsdp, const std::string& schedule, int virtual_stages,
                      const std::vector<int>& blocks) {
    std::string splits;
    int at = 0;
    for (size_t s = 0; s + 1 < blocks.size(); ++s)
        splits += (s ? ", " : "") + repeat + "." + std::to_string(at += blocks[s]);
    const std::string dp = fsdp ? "data_parallel: {mesh_dim: dp, mode: fully_shard, fully_shard: [\"" +
                                      repeat + ".*\"]}\nactivation_checkpointing: [\"" + repeat + ".*\"]\n"
                                : "data_parallel: {mesh_dim: dp, mode: replicate}\n";
    return "mesh: {pp: 4, dp: 2}\n" + dp + "pipeline_parallel: {mesh_dim: pp, schedule: " + schedule +
           (virtual_stages > 1 && schedule != "zbv" ? ", virtual_stages: " + std::to_string(virtual_stages)
                                                    : "") +
           ", microbatches: 8, split_points: [" + splits + "]}\n";
}

void require_same_work(const MetaWork& a, const MetaWork& b) {
    REQUIRE(a.gemm_flops == b.gemm_flops);
    REQUIRE(a.recompute_flops == b.recompute_flops);
    REQUIRE(a.memory_bytes == b.memory_bytes);
    REQUIRE(a.kernels == b.kernels);
    REQUIRE(a.gemms == b.gemms);
    REQUIRE(a.attention == b.attention);
    REQUIRE(a.ops.size() == b.ops.size());
}

TEST_CASE(
    "a pipeline rank sampled with one block in every other stage is the rank sampled with k in every stage",
    "[cpu][pipeline_samples]") {
    const int k = 3;
    const std::vector<SampledModel> models = {
        {"llama_rope.yaml",
         "layers",
         {{"tokens: [4, 8]", "tokens: [16, 8]"}, {"gradient_accumulation: 2", "gradient_accumulation: 1"}}},
        // its head tied to the embedding: the first and the last stage share the weight (a group of
        // the pp ranks that hold them)
        {"gpt2_tied.yaml", "h", {{"tokens: [4, 16]", "tokens: [16, 16]"}}}};
    const std::vector<std::pair<std::string, int>> schedules = {
        {"1f1b", 1}, {"interleaved_1f1b", 2}, {"zbv", 2}, {"zero_bubble", 1}, {"dualpipev", 2}};
    for (const SampledModel& model : models)
        for (bool fsdp : {true, false})
            for (const auto& [schedule, v] : schedules) {
                const std::vector<int> uniform(static_cast<size_t>(4 * v), k);
                RunInputs full;
                full.model_path = model.file;
                full.model_text = model.text(k * 4 * v);
                const Plan whole =
                    load_plan_text(plan_text(model.repeat, fsdp, schedule, v, uniform), "whole.yaml");
                const std::vector<int> placed = stage_placement(whole.pipeline->schedule, 4, 4 * v);
                for (int pp_rank : {0, 1, 3}) {
                    CAPTURE(model.file, fsdp, schedule, pp_rank);
                    const std::vector<int> blocks = sampled_stage_blocks(placed, pp_rank, k);
                    int total = 0;
                    for (int b : blocks) total += b;
                    REQUIRE(total < k * 4 * v);
                    RunInputs cut = full;
                    cut.model_text = model.text(total);
                    const Plan sampled =
                        load_plan_text(plan_text(model.repeat, fsdp, schedule, v, blocks), "sampled.yaml");
                    const int rank = pp_rank * 2;  // dp rank 0 of the pp rank
                    const RankSimulation a = simulate_rank(full, whole, rank, kSteadyStateSteps, true);
                    const RankSimulation b = simulate_rank(cut, sampled, rank, kSteadyStateSteps, true);
                    REQUIRE(a.memory.peak == b.memory.peak);
                    REQUIRE(a.memory.resident == b.memory.resident);
                    REQUIRE(a.memory.first_step_peak == b.memory.first_step_peak);
                    REQUIRE(a.memory.reserved_peak == b.memory.reserved_peak);
                    REQUIRE(a.memory.over_capacity == b.memory.over_capacity);
                    REQUIRE(a.memory.torch_peak == b.memory.torch_peak);
                    REQUIRE(a.memory.torch_first_step_peak == b.memory.torch_first_step_peak);
                    REQUIRE(a.memory.at_peak == b.memory.at_peak);
                    REQUIRE(a.memory.torch_at_peak == b.memory.torch_at_peak);
                    REQUIRE(a.memory.reserved_by_stream == b.memory.reserved_by_stream);
                    REQUIRE(a.last_step_replayed == b.last_step_replayed);
                    require_same_work(a.step_work, b.step_work);
                    REQUIRE(same(by_op_dim(a.step_comm), by_op_dim(b.step_comm)));
                    REQUIRE(a.actions.size() == b.actions.size());
                    for (size_t i = 0; i < a.actions.size(); ++i) {
                        require_same_work(a.actions[i].work, b.actions[i].work);
                        REQUIRE(same(a.actions[i].comm, b.actions[i].comm));
                    }
                    // both ran the rank's own stages only: the same passes, each stage's first and
                    // last block's at the same peaks
                    auto pa = by_stage(a.phase_peaks, model.repeat, uniform),
                         pb = by_stage(b.phase_peaks, model.repeat, blocks);
                    for (auto* p : {&pa, &pb})
                        for (auto it = p->begin(); it != p->end();)
                            it = it->first.find(".mid") != std::string::npos ? p->erase(it) : std::next(it);
                    REQUIRE(!pb.empty());
                    REQUIRE(pa == pb);
                }
            }
}

}  // namespace test_pipeline_samples
