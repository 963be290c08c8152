// bench_ops: every case of the op-case table (tests/op_cases.h) timed on the CPU backend, and on
// the GPU where the build and the machine have one, each against a limit measured in the same run:
// a GEMM case's GEMM at the sgemm rate on its own shape (cuBLAS in float32 on the GPU), any other
// case's work as the meta backend counts it (what the planner prices), its bytes at the memcpy rate
// (a device copy's on the GPU) plus its FLOPs (the attention oracle's tiles) at a 512^3 sgemm's rate.
// The cases are the tests' shapes, small: the ratios show each op's fixed costs as much as its
// kernel, and tensors that stay in cache can beat the memcpy rate (a ratio under 1). Fused
// attention where a backend has no kernel (the CPU) times the oracle through its plain ops
// (tests/attention_oracle.h: the tile path's GEMMs and softmaxes, its mask built element by element
// on the host), marked "(oracle)". Never gates CI.
//   ./build/bench/bench_ops [OP]     (OP: only the rows whose op name contains it)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/gpu_info.h"
#include "backend/meta/meta_backend.h"
#include "gemm_limit.h"
#include "op_cases.h"

using namespace ptool;
using namespace ptool::testing;

namespace {

// The rates a device's limits are priced at, measured at start.
struct Rates {
    double copy_bytes_per_s = 0;  // bytes read plus bytes written
    double gemm_flops_per_s = 0;  // a 512^3 float32 GEMM
};

Rates measure_rates(Device device) {
    const int64_t n = 512;
    Rates r;
    r.gemm_flops_per_s = 2.0 * n * n * n / bench::gemm_seconds(n, n, n, false, false, 5, device);
    const int64_t elems = int64_t(16) << 20;  // 64 MiB of float32
    if (device == Device::cpu) {              // one thread's memcpy, as the other benches' limit
        std::vector<char> src(static_cast<size_t>(elems * 4), 1), dst(src.size());
        r.copy_bytes_per_s = 2.0 * static_cast<double>(src.size()) /
                             bench::best_seconds(5, [&] { std::memcpy(dst.data(), src.data(), src.size()); });
        return r;
    }
    Backend& be = backend_for(device);
    const Tensor src({elems}, DType::float32, device);
    Tensor dst({elems}, DType::float32, device);
    be.copy(src, dst), be.synchronize();
    r.copy_bytes_per_s = 2.0 * static_cast<double>(src.nbytes()) / bench::best_seconds(5, [&] {
                             be.copy(src, dst);
                             be.synchronize();
                         });
    return r;
}

// What the meta backend counts for one run of the case's op.
MetaWork meta_work_of(const OpCase& c) {
    OpRun run = c.setup(backend_for(Device::meta));
    const MetaWork before = meta_work();
    run.op();
    return work_since(before, meta_work());
}

// The op's best time over enough runs to fill about 50 ms (3 at least).
double op_seconds(Backend& be, OpRun& run) {
    run.op(), be.synchronize();  // warm-up: first touches, kernel choices
    const double once = bench::best_seconds(1, [&] {
        run.op();
        be.synchronize();
    });
    const int repeats = std::clamp(static_cast<int>(0.05 / std::max(once, 1e-7)), 3, 2000);
    return bench::best_seconds(repeats, [&] {
        run.op();
        be.synchronize();
    });
}

void bench_device(Device device, const std::string& only) {
    Backend& be = backend_for(device);
    const Rates rates = measure_rates(device);
    const char* gemm_name = device == Device::cpu ? "sgemm" : "cuBLAS float32";
    std::printf("bench_ops on %s: %s 512^3 at %.1f GFLOP/s, %s of 64 MiB at %.1f GB/s (read + write)\n",
                be.name().c_str(), gemm_name, rates.gemm_flops_per_s / 1e9,
                device == Device::cpu ? "memcpy" : "device copy", rates.copy_bytes_per_s / 1e9);
    std::printf("%-26s %-9s %-56s %10s %10s %-7s %7s\n", "op", "dtype", "case", "time us", "limit us",
                "limit", "ratio");
    double log_ratios = 0;
    int cases = 0;
    for (const OpRow& row : op_table()) {
        if (row.op.find(only) == std::string::npos) continue;
        for (DType dt : kOpDtypes)
            for (const OpCase& c : row.cases(dt)) {
                // a fused attention case where the backend has no kernel for it: the oracle's ops
                const bool oracle = c.compared_on && !c.compared_on(be);
                const std::string label = oracle ? c.label + " (oracle)" : c.label;
                OpRun run = c.setup(be);
                const double t = op_seconds(be, run);
                double limit = 0;
                const char* kind = "memcpy";
                if (c.gemm) {
                    const GemmShape& g = *c.gemm;
                    limit = static_cast<double>(g.batch) *
                            bench::gemm_seconds(g.m, g.n, g.k, g.trans_a, g.trans_b, 5, device);
                    kind = device == Device::cpu ? "sgemm" : "cuBLAS";
                } else {
                    const MetaWork w = meta_work_of(c);
                    limit = w.gemm_flops / rates.gemm_flops_per_s + w.memory_bytes / rates.copy_bytes_per_s;
                    kind = w.gemm_flops > 0 ? "both" : "memcpy";
                }
                if (limit <= 0) {  // the meta backend counts nothing (draw_init): no limit to compare with
                    std::printf("%-26s %-9s %-56s %10.2f %10s %-7s %7s\n", row.op.c_str(), dtype_name(dt),
                                label.c_str(), t * 1e6, "-", "-", "-");
                    continue;
                }
                std::printf("%-26s %-9s %-56s %10.2f %10.2f %-7s %7.2f\n", row.op.c_str(), dtype_name(dt),
                            label.c_str(), t * 1e6, limit * 1e6, kind, t / limit);
                log_ratios += std::log(t / limit), ++cases;
            }
    }
    std::printf("RESULT device=%s cases=%d geomean_ratio=%.3f\n", device == Device::cpu ? "cpu" : "cuda",
                cases, cases ? std::exp(log_ratios / cases) : 0.0);
}

int main_impl(int argc, char** argv) {
    const std::string only = argc > 1 ? argv[1] : "";
    bench_device(Device::cpu, only);
#ifdef PTOOL_HAVE_CUDA
    const GpuInfo gpus = query_gpus();
    if (!gpus.devices.empty())
        bench_device(Device::cuda, only);
    else
        std::printf("no GPU: %s\n", gpus.why_none.c_str());
#endif
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return main_impl(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_ops: %s\n", e.what());
        return 1;
    }
}
