// bench_run: one training step of a model (default models/gemm_mlp.yaml) against the OpenBLAS
// sgemm rate on the same GEMM shapes, measured in the same run.
//   ./build/bench/bench_run [MODEL] [REPEATS]
// A linear layer [rows, in] -> [rows, out] costs 3 GEMMs per step (forward y = x W^T, backward
// dW = dy^T x and dx = dy W), 2*rows*in*out FLOPs each.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "model/batch.h"
#include "verify/reference.h"

using namespace ptool;

namespace {

template <class F>
double best_seconds(int repeats, F&& f) {
    double best = 1e30;
    for (int i = 0; i < repeats; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

struct Gemm {
    int m, n, k;
    bool ta, tb;
};

}  // namespace

int main(int argc, char** argv) {
    const std::string path = argc > 1 ? argv[1] : PTOOL_SOURCE_DIR "/models/gemm_mlp.yaml";
    const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
    Model model = load_model(path, "float32");
    DataSource data(model);
    const int64_t rows = model.input.shape[0] * (model.input.shape.size() == 3 ? model.input.shape[1] : 1);

    std::vector<Gemm> gemms;
    double flops = 0;
    for_each_module(*model.root, [&](const std::string&, Module& m) {
        if (auto* l = dynamic_cast<Linear*>(&m)) {
            const int in = static_cast<int>(l->in_features()), out = static_cast<int>(l->out_features());
            const int r = static_cast<int>(rows);
            gemms.push_back({r, out, in, false, true});   // y = x W^T
            gemms.push_back({out, in, r, true, false});   // dW = dy^T x
            gemms.push_back({r, in, out, false, false});  // dx = dy W
            flops += 3.0 * 2.0 * rows * in * out;
        }
    });

    double gemm_seconds = 0;
    for (const Gemm& g : gemms) {
        std::vector<float> a(static_cast<size_t>(g.m) * g.k, 0.5f), b(static_cast<size_t>(g.k) * g.n, 0.25f),
            c(static_cast<size_t>(g.m) * g.n);
        gemm_seconds += best_seconds(repeats, [&] {
            cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.m, g.n,
                        g.k, 1.0f, a.data(), g.ta ? g.m : g.k, b.data(), g.tb ? g.k : g.n, 0.0f, c.data(), g.n);
        });
    }

    double step_seconds = 1e30;
    for (int i = 0; i < repeats; ++i)
        run_reference(model, data, {1, Device::cpu}, [&](const StepResult& r) { step_seconds = std::min(step_seconds, r.seconds); });

    std::printf("bench_run %s: %d GEMMs, %.2f GFLOP per step, OpenBLAS threads %d\n", model.name.c_str(),
                static_cast<int>(gemms.size()), flops / 1e9, openblas_get_num_threads());
    std::printf("  sgemm on the same shapes: %8.2f ms  %7.1f GFLOP/s (the limit)\n", gemm_seconds * 1e3,
                flops / gemm_seconds / 1e9);
    std::printf("  ptool step (fwd+bwd+sgd): %8.2f ms  %7.1f GFLOP/s\n", step_seconds * 1e3, flops / step_seconds / 1e9);
    std::printf("  ratio to sgemm: %.1f%%  (target >= 70%%)\n", 100.0 * gemm_seconds / step_seconds);
    return 0;
}
