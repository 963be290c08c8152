// The GEMM limit for a model's linear layers, measured in the benchmark's own run: OpenBLAS sgemm
// on the CPU, the backend's cuBLAS GEMM on device tensors for cuda (the same shapes, synchronised).
// A linear [rows, in] -> [rows, out] costs 3 GEMMs per training step (y = x W^T, dW = dy^T x,
// dx = dy W), 2 * rows * in * out FLOPs each. Given a TP plan and its size, the shapes are the
// ranks' shards (colwise divides out, rowwise divides in; other linears are replicated) and each
// runs once per rank: the GEMMs a parallel step of every rank on one device really does.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "parallel/plan.h"

namespace ptool::bench {

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

// One GEMM c [m, n] = op(a) op(b) reducing over k, best of `repeats`: OpenBLAS sgemm on the CPU,
// the backend's GEMM (cuBLAS) on device tensors of `dtype` for another device, synchronised.
inline double gemm_seconds(int64_t m, int64_t n, int64_t k, bool ta, bool tb, int repeats,
                           Device device = Device::cpu, DType dtype = DType::float32) {
    if (device != Device::cpu) {
        Backend& be = backend_for(device);
        Tensor a(ta ? Shape{k, m} : Shape{m, k}, dtype, device),
            b(tb ? Shape{n, k} : Shape{k, n}, dtype, device);
        Tensor c({m, n}, dtype, device);
        be.gemm(a, ta, b, tb, c);  // warm-up (cuBLAS picks its kernel)
        be.synchronize();
        return best_seconds(repeats, [&] {
            be.gemm(a, ta, b, tb, c);
            be.synchronize();
        });
    }
    std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
        c(static_cast<size_t>(m * n));
    const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);  // cblas' ints
    return best_seconds(repeats, [&] {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, im, in, ik,
                    1.0f, a.data(), ta ? im : ik, b.data(), tb ? ik : in, 0.0f, c.data(), in);
    });
}

struct GemmLimit {
    int gemms = 0;
    double flops = 0;    // one training step
    double seconds = 0;  // the same GEMMs at the measured sgemm rate
};

inline GemmLimit measure_gemm_limit(const Model& model, int repeats, Device device = Device::cpu,
                                    const Plan* plan = nullptr, int tp = 1) {
    struct Gemm {
        int m, n, k;
        bool ta, tb;
        int copies = 1;  // ranks that run this shape
    };
    std::vector<Gemm> gemms;
    GemmLimit lim;
    const int64_t rows = numel_of(model.input.shape) / (model.input.ids ? 1 : model.input.shape.back());
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        if (auto* l = dynamic_cast<Linear*>(&m)) {
            int in = static_cast<int>(l->in_features()), out = static_cast<int>(l->out_features());
            for (const PlanEntry& e : plan ? plan->tp_plan : std::vector<PlanEntry>{})
                if (fqn_matches(e.pattern, fqn)) {  // the weight's sharded dim: [out, in]
                    for (const ParamPlacement& pp : e.style.style->params(m))
                        if (pp.param == "weight" && pp.placement.is_shard())
                            (pp.placement.dim == 0 ? out : in) /= tp;
                    break;
                }
            const int r = static_cast<int>(rows);
            gemms.push_back({r, out, in, false, true, tp});
            gemms.push_back({out, in, r, true, false, tp});
            gemms.push_back({r, in, out, false, false, tp});
            lim.flops += tp * 3.0 * 2.0 * static_cast<double>(rows) * in * out;
        }
    });
    for (const Gemm& g : gemms)
        lim.seconds += g.copies * gemm_seconds(g.m, g.n, g.k, g.ta, g.tb, repeats, device, model.dtype);
    for (const Gemm& g : gemms) lim.gemms += g.copies;
    return lim;
}

}  // namespace ptool::bench
