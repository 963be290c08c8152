// bench_run: one training step of a model (default models/gemm_mlp.yaml) against the OpenBLAS
// sgemm rate on the same GEMM shapes, measured in the same run.
//   ./build/bench/bench_run [MODEL] [REPEATS]
#include <cstdio>

#include "core/yaml_reader.h"
#include "gemm_limit.h"
#include "verify/verify.h"

using namespace ptool;

int main(int argc, char** argv) {
    const std::string path = argc > 1 ? argv[1] : PTOOL_SOURCE_DIR "/models/gemm_mlp.yaml";
    const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
    RunInputs in;
    in.model_path = path;
    in.model_text = read_file(path, 1 << 22);
    in.dtype_override = "float32";
    const Model model = load_model_text(in.model_text, path, "float32", false);
    const bench::GemmLimit lim = bench::measure_gemm_limit(model, repeats);
    double step_seconds = 1e30;
    RecordOptions ro;  // `ptool run`'s loop: the reference Run, recorded
    ro.events = false;
    ro.tensors = false;
    ro.on_step = [&](int64_t, double, double seconds) { step_seconds = std::min(step_seconds, seconds); };
    for (int i = 0; i < repeats; ++i) record_reference(in, single_device_plan(), 1, ro);
    std::printf("bench_run %s: %d GEMMs, %.2f GFLOP per step, OpenBLAS threads %d\n", model.name.c_str(),
                lim.gemms, lim.flops / 1e9, openblas_get_num_threads());
    std::printf("  sgemm on the same shapes: %8.2f ms  %7.1f GFLOP/s (the limit)\n", lim.seconds * 1e3,
                lim.flops / lim.seconds / 1e9);
    std::printf("  ptool step (fwd+bwd+sgd): %8.2f ms  %7.1f GFLOP/s\n", step_seconds * 1e3,
                lim.flops / step_seconds / 1e9);
    std::printf("  ratio to sgemm: %.1f%%  (target >= 70%%)\n", 100.0 * lim.seconds / step_seconds);
    return 0;
}
