// The planner's pipeline samples (plan/pipeline_search.h, sampled_stage_blocks): a pp rank
// simulated with a model and plan whose other stages hold one block each is the rank simulated with
// k blocks in every stage, but for its blocks' indices: the same memory (every peak, by use, the
// allocator's reserved), the same work and collectives, action by action, and the same module-pass
// peaks once a block's index is read as its stage's first or last.

#include <map>
#include <string>

#include "parallel/plan.h"
#include "plan/pipeline_search.h"
#include "test_helpers.h"
#include "train/schedule.h"
#include "train/simulate.h"

using namespace ptool;

namespace test_pipeline_samples {

// "layers.7.attn_block/b" -> "s1.first.attn_block/b" where block 7 starts stage 1 of `blocks`; a
// block inside a stage -> "s1.mid"; other labels as they are.
std::map<std::string, int64_t> by_stage(const std::map<std::string, int64_t>& peaks,
                                        const std::vector<int>& blocks) {
    std::map<std::string, int64_t> out;
    for (const auto& [label, peak] : peaks) {
        std::string key = label;
        if (label.rfind("layers.", 0) == 0) {
            const size_t end = label.find_first_of("./", 7);
            const int i = std::stoi(label.substr(7, end - 7));
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

// models/llama_rope.yaml with `blocks` blocks, 16 rows a step and no gradient accumulation
std::string model_text(std::string text, int blocks) {
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"count: 2", "count: " + std::to_string(blocks)},
             {"tokens: [4, 8]", "tokens: [16, 8]"},
             {"gradient_accumulation: 2", "gradient_accumulation: 1"}}) {
        const size_t at = text.find(from);
        REQUIRE(at != std::string::npos);
        text.replace(at, from.size(), to);
    }
    return text;
}

std::string plan_text(const std::string& schedule, int virtual_stages, const std::vector<int>& blocks) {
    std::string splits;
    int at = 0;
    for (size_t s = 0; s + 1 < blocks.size(); ++s)
        splits += (s ? ", " : "") + std::string("layers.") + std::to_string(at += blocks[s]);
    return "mesh: {pp: 4, dp: 2}\n"
           "data_parallel: {mesh_dim: dp, mode: fully_shard, fully_shard: [\"layers.*\"]}\n"
           "activation_checkpointing: [\"layers.*\"]\n"
           "pipeline_parallel: {mesh_dim: pp, schedule: " +
           schedule +
           (virtual_stages > 1 && schedule != "zbv" ? ", virtual_stages: " + std::to_string(virtual_stages)
                                                    : "") +
           ", microbatches: 8, split_points: [" + splits + "]}\n";
}

TEST_CASE(
    "a pipeline rank sampled with one block in every other stage is the rank sampled with k in every stage",
    "[cpu][pipeline_samples]") {
    const std::string base = read_text(std::string(PTOOL_SOURCE_DIR) + "/models/llama_rope.yaml");
    const int k = 3;
    for (const auto& [schedule, v] : std::vector<std::pair<std::string, int>>{
             {"1f1b", 1}, {"interleaved_1f1b", 2}, {"zbv", 2}, {"zero_bubble", 1}}) {
        const std::vector<int> uniform(static_cast<size_t>(4 * v), k);
        RunInputs full;
        full.model_path = "llama_rope.yaml";
        full.model_text = model_text(base, k * 4 * v);
        const Plan whole = load_plan_text(plan_text(schedule, v, uniform), "whole.yaml");
        const std::vector<int> placed = stage_placement(whole.pipeline->schedule, 4, 4 * v);
        for (int pp_rank : {0, 1, 3}) {
            CAPTURE(schedule, pp_rank);
            const std::vector<int> blocks = sampled_stage_blocks(placed, pp_rank, k);
            int total = 0;
            for (int b : blocks) total += b;
            REQUIRE(total < k * 4 * v);
            RunInputs cut = full;
            cut.model_text = model_text(base, total);
            const Plan sampled = load_plan_text(plan_text(schedule, v, blocks), "sampled.yaml");
            const int rank = pp_rank * 2;  // dp rank 0 of the pp rank
            const RankSimulation a = simulate_rank(full, whole, rank, kSteadyStateSteps, true);
            const RankSimulation b = simulate_rank(cut, sampled, rank, kSteadyStateSteps, true);
            REQUIRE(a.memory.peak == b.memory.peak);
            REQUIRE(a.memory.resident == b.memory.resident);
            REQUIRE(a.memory.first_step_peak == b.memory.first_step_peak);
            REQUIRE(a.memory.reserved_peak == b.memory.reserved_peak);
            REQUIRE(a.memory.torch_peak == b.memory.torch_peak);
            REQUIRE(a.memory.at_peak == b.memory.at_peak);
            REQUIRE(a.memory.torch_at_peak == b.memory.torch_at_peak);
            REQUIRE(a.memory.reserved_by_stream == b.memory.reserved_by_stream);
            REQUIRE(a.step_work.gemm_flops == b.step_work.gemm_flops);
            REQUIRE(a.step_work.memory_bytes == b.step_work.memory_bytes);
            REQUIRE(a.step_work.gemms == b.step_work.gemms);
            REQUIRE(same(by_op_dim(a.step_comm), by_op_dim(b.step_comm)));
            REQUIRE(a.actions.size() == b.actions.size());
            for (size_t i = 0; i < a.actions.size(); ++i) {
                REQUIRE(a.actions[i].work.gemm_flops == b.actions[i].work.gemm_flops);
                REQUIRE(a.actions[i].work.memory_bytes == b.actions[i].work.memory_bytes);
                REQUIRE(same(a.actions[i].comm, b.actions[i].comm));
            }
            REQUIRE(!a.phase_peaks.empty());
            REQUIRE(by_stage(a.phase_peaks, uniform).size() >= by_stage(b.phase_peaks, blocks).size());
            // every pass of the rank's own stages, mapped to its stage's first or last block
            const auto pa = by_stage(a.phase_peaks, uniform), pb = by_stage(b.phase_peaks, blocks);
            for (const auto& [key, peak] : pb) {
                if (key.find(".mid") != std::string::npos) continue;
                CAPTURE(key);
                REQUIRE(pa.count(key) == 1);
                REQUIRE(pa.at(key) == peak);
            }
        }
    }
}

}  // namespace test_pipeline_samples
