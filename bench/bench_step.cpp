// bench_step: the training steps of one run of a model under a plan (none: `ptool run`'s single
// device), with the time from launch to its first step, each step's time, the peak memory, and
// the GEMM limit of a step measured in the same run (OpenBLAS sgemm on the CPU, cuBLAS on the
// same shapes on cuda). bench/bench_torch.py runs it beside PyTorch's step of the same model.
//   ./build/bench/bench_step MODEL [PLAN|-] [cpu|cuda] [STEPS]
// The last line is machine-readable: RESULT key=value ...
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "comm/comm_choice.h"
#include "core/yaml_reader.h"
#include "gemm_limit.h"
#include "verify/verify.h"

using namespace ptool;

namespace {

const auto kLaunch = std::chrono::steady_clock::now();  // before main: the process's start, near enough

double since_launch() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - kLaunch).count();
}

int64_t peak_bytes(Device device) {
#ifdef PTOOL_HAVE_CUDA
    if (device == Device::cuda) return cuda_memory_stats().peak_in_use;
#endif
    (void)device;
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<int64_t>(u.ru_maxrss) * 1024;  // the process's peak resident set
}

int main_impl(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: bench_step MODEL [PLAN|-] [cpu|cuda] [STEPS]\n");
        return 2;
    }
    const std::string model_path = argv[1], plan_path = argc > 2 ? argv[2] : "-";
    const Device device = argc > 3 && std::string(argv[3]) == "cuda" ? Device::cuda : Device::cpu;
    const int64_t steps = argc > 4 ? std::atoll(argv[4]) : 3;
    RunInputs in;
    in.model_path = model_path;
    in.model_text = read_file(model_path, 1 << 22);
    in.device = device;
    const Plan plan = plan_path == "-" ? single_device_plan() : load_plan(plan_path);
    PTOOL_REQUIRE(plan.world_size() == 1, "bench_step runs one rank: the plan's mesh must be 1 ({} ranks)",
                  plan.world_size());
    std::vector<double> step_seconds;
    double first_step_at = 0;
    RecordOptions ro;  // `ptool run`'s recording: the loss only
    ro.events = false, ro.tensors = false;
    ro.on_step = [&](int64_t k, double loss, double seconds) {
        if (k == 0) first_step_at = since_launch() - seconds;
        step_seconds.push_back(seconds);
        std::printf("step %lld  loss %.6g  %.1f ms\n", static_cast<long long>(k), loss, seconds * 1e3);
        std::fflush(stdout);
    };
    run_ranks(
        1, CommOptions{},
        [&](Communicator& world) {
            Run run(in, plan, world);
            record_run(run, steps, ro);
        },
        device);
    const int64_t peak = peak_bytes(device);
    double best = 1e30;  // the steady step: the fastest after the first (which loads kernels, fills caches)
    for (size_t k = step_seconds.size() > 1 ? 1 : 0; k < step_seconds.size(); ++k)
        best = std::min(best, step_seconds[k]);
    const Model model = load_model_text(in.model_text, model_path, "", false);
    const bench::GemmLimit lim = bench::measure_gemm_limit(model, 3, device);
    int64_t params = 0;
    for (const auto& [name, p] : model.named_parameters()) params += p->value.numel();
    std::printf("bench_step %s on %s (%s): %lld parameters, %d GEMMs of %.1f GFLOP a step\n",
                model.name.c_str(), backend_for(device).name().c_str(),
                plan_path == "-" ? "one device" : plan_path.c_str(), static_cast<long long>(params),
                lim.gemms, lim.flops / 1e9);
    std::printf("  first step started %.2f s after launch; steady step %.1f ms; peak memory %.2f GiB\n",
                first_step_at, best * 1e3, peak / 1073741824.0);
    std::printf(
        "  the step's GEMMs at the %s rate of the same run: %.1f ms (%.1f GFLOP/s); step / GEMMs %.2fx\n",
        device == Device::cuda ? "cuBLAS" : "sgemm", lim.seconds * 1e3, lim.flops / lim.seconds / 1e9,
        best / lim.seconds);
    std::printf("RESULT step_s=%.6f first_step_s=%.3f peak_bytes=%lld gemm_s=%.6f gemm_flops=%.6g\n", best,
                first_step_at, static_cast<long long>(peak), lim.seconds, lim.flops);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return main_impl(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_step: %s\n", e.what());
        return 1;
    }
}
