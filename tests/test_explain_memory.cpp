// explain's estimate of what verify's reference keeps per step (record_step_bytes) against the
// bytes a reference run really records in a step: tensors and module events, for every shipped
// model small enough to run here, on one device and with the batch split over 2 dp ranks.
#include <filesystem>

#include "plan/explain.h"
#include "test_helpers.h"
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

}  // namespace test_explain_memory
