// explain's estimate of what verify's reference keeps per step (record_step_bytes) against the
// bytes a reference run really records in a step: tensors and module events, for every shipped
// model small enough to run here, on one device and with the batch split over 2 dp ranks.
#include <filesystem>

#include "core/allocator_model.h"
#include "plan/explain.h"
#include "test_helpers.h"
#include "train/simulate.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_explain_memory {

namespace {

int64_t recorded_bytes(const StepRecord& s) {
    int64_t bytes = 0;
    for (const auto& [name, t] : s.tensors) bytes += static_cast<int64_t>(t.nbytes());
    for (const ModuleEvent& e : s.events) bytes += static_cast<int64_t>(e.full.nbytes());
    return bytes;
}

}  // namespace

TEST_CASE("explain's verify record per step is what the reference records", "[cpu]") {
    const std::string dir = PTOOL_SOURCE_DIR;
    int models = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/models")) {
        const std::string path = entry.path().string(), stem = entry.path().stem().string();
        if (entry.path().extension() != ".yaml" || stem.rfind("gemm_mlp", 0) == 0) continue;  // bench-sized
        RunInputs in;
        in.model_path = path;
        in.model_text = read_text(path);
        const RunRecord ref = record_reference(in, single_device_plan(), 1, RecordOptions{});
        REQUIRE(ref.steps.size() == 1);
        for (const char* mesh :
             {"mesh: {world: 1}\n", "mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n"}) {
            INFO(stem << " with " << mesh);
            const Model m = load_model_text(in.model_text, path, "", false);
            if (std::string(mesh).find("dp") != std::string::npos && m.input.shape.at(0) % 2)
                continue;  // rows must split
            const Explanation ex = explain_plan(m, load_plan_text(mesh, "test.yaml"));
            CHECK(ex.record_step_bytes == recorded_bytes(ref.steps[0]));
        }
        ++models;
    }
    CHECK(models >= 10);
}

TEST_CASE("the last step's allocations replayed are the step simulated again, to the byte", "[cpu]") {
    // (model, plan): mixed precision, FSDP with TP and checkpointing, ZeRO-2, experts over dp,
    // context parallel at scale, pipelines (1F1B, interleaved, a tied head across stages)
    const std::pair<const char*, const char*> cases[] = {
        {"models/llama_rope.yaml", "plans/llama_rope_fsdp_tp_ac.yaml"},
        {"models/llama_rope.yaml", "plans/llama_rope_zero2_tp_bf16.yaml"},
        {"models/llama_rope.yaml", "plans/llama_rope_ddp_tp_bf16.yaml"},
        {"models/hf_tiny_llama31.yaml", "plans/hf_tiny_llama31_fsdp_tp_sac.yaml"},
        {"models/moe_mixtral.yaml", "plans/moe_mixtral_ep_fsdp.yaml"},
        {"models/gpt2_tied.yaml", "tests/data/pipeline/gpt2_tied_pp2_v2.yaml"},
        {"models/llama_rope.yaml", "tests/data/pipeline/llama_rope_pp2_tp2_sp_sac.yaml"},
        {"models/llama_sft.yaml", "tests/data/pipeline/llama_sft_pp2_dp2.yaml"},
        {"models/scale/llama3_8b.yaml", "plans/scale/llama3_8b_fsdp2_cp4.yaml"},
        {"models/scale/llama3_70b.yaml", "plans/scale/llama3_70b_torchtitan.yaml"},
    };
    for (const auto& [model, plan_path] : cases) {
        RunInputs in;
        in.model_path = PTOOL_SOURCE_DIR "/" + std::string(model);
        in.model_text = read_text(in.model_path);
        const Plan plan = load_plan_text(read_text(PTOOL_SOURCE_DIR "/" + std::string(plan_path)), plan_path);
        for (int rank : {0, plan.world_size() - 1}) {
            INFO(plan_path << " rank " << rank);
            for (size_t capacity : {size_t{0}, size_t{3} << 20}) {  // unbounded, and one it goes over
                const RankSimulation simulated =
                    simulate_rank(in, plan, rank, 3, true, capacity, nullptr, false);
                const RankSimulation replayed =
                    simulate_rank(in, plan, rank, 3, true, capacity, nullptr, true);
                CHECK_FALSE(simulated.last_step_replayed);
                REQUIRE(replayed.last_step_replayed);
                const RankMemory &a = simulated.memory, &b = replayed.memory;
                CHECK(a.reserved_peak == b.reserved_peak);
                CHECK(a.torch_peak == b.torch_peak);
                CHECK(a.peak == b.peak);
                CHECK(a.over_capacity == b.over_capacity);
                CHECK(a.reserved_by_stream == b.reserved_by_stream);
                for (int u = 0; u < kMemoryUses; ++u) CHECK(a.torch_at_peak[u] == b.torch_at_peak[u]);
                CHECK(simulated.phase_peaks == replayed.phase_peaks);
                CHECK(simulated.step_work.gemm_flops == replayed.step_work.gemm_flops);
                CHECK(simulated.actions.size() == replayed.actions.size());
            }
        }
    }
}

TEST_CASE("a recorded step replays only where it hands its objects on as a steady state does", "[cpu]") {
    // a step: frees the output the step before held, allocates activations and frees them, and
    // holds a new output; played twice by hand against recorded once and replayed
    int objects[64];
    auto step = [&](AllocatorModel& m, int first, const void* held_before) {
        const void* out = &objects[first];
        m.allocate(&objects[first + 1], 3 << 20);
        if (held_before) m.release(held_before);  // the output held since the step before
        m.allocate(&objects[first + 2], 5 << 20);
        m.release(&objects[first + 1]);
        m.allocate(out, 2 << 20);  // held to the next step
        m.release(&objects[first + 2]);
        return out;
    };
    AllocatorModel by_hand, replayed;
    const void* held = step(by_hand, 0, nullptr);
    held = step(by_hand, 4, held);
    step(by_hand, 8, held);
    const void* r = step(replayed, 0, nullptr);
    replayed.record_step();
    step(replayed, 4, r);
    REQUIRE(replayed.replay_step());
    CHECK(replayed.peak_reserved() == by_hand.peak_reserved());
    CHECK(replayed.peak_in_use() == by_hand.peak_in_use());
    CHECK(replayed.in_use() == by_hand.in_use());
    CHECK(replayed.reserved() == by_hand.reserved());
    // a step that keeps what it allocates (the first step's optimizer state) hands nothing on
    AllocatorModel first;
    first.record_step();
    first.allocate(&objects[20], 1 << 20);
    CHECK_FALSE(first.replay_step());
    CHECK(first.in_use() == (size_t{1} << 20));  // and nothing was replayed
    // a step that frees an older object of another size than the one it holds on
    AllocatorModel other;
    other.allocate(&objects[30], 1 << 20);
    other.record_step();
    other.release(&objects[30]);
    other.allocate(&objects[31], 2 << 20);
    CHECK_FALSE(other.replay_step());
}

}  // namespace test_explain_memory
