// The kernel model: the seconds a rank's counted work (backend/meta/meta_backend.h: each GEMM's
// shape, each fused attention's, the bytes of the memory-bound ops) takes on one GPU of a cluster,
// term by term (docs/planning.md, "The time model"):
//
//   GEMMs            each shape's seconds from the cluster's kernel table (plan/kernel_table.h),
//                    interpolated in log space; fwd, dgrad and wgrad apart
//   attention        each fused kernel's FLOPs at the table's rate for its sequence and phase
//   memory-bound     the bytes ptool's other ops read and write, at the measured streaming
//                    bandwidth (the table's copy); a framework op ptool runs as other kernels
//                    (OpClass: the eager RMSNorm, RoPE, the upcast loss, AdamW's foreach update)
//                    at its measured time per element where the table has it, else at the bytes its
//                    framework's kernel sequence moves (framework_bytes) over the streaming bandwidth
//
// A cluster whose GPU the table was not measured on takes the table's times scaled by the peaks
// (compute by the dtype's dense FLOP/s, a float8 GEMM's by the float8 peaks, memory-bound by the
// memory bandwidth): derived. A cluster without a table takes the roofline (GEMM and attention FLOPs
// at gemm_efficiency of peak, a float8 GEMM's of the float8 peak, bytes at the memory bandwidth):
// assumed. A float8 GEMM on a cluster whose `tflops` has no float8 (no float8 tensor cores) is
// InputError naming the cluster.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "backend/meta/meta_backend.h"
#include "plan/cluster.h"

namespace ptool {

struct ComputeTerms {
    struct Shape {  // one GEMM shape or fused attention kernel: its calls (or FLOPs) and seconds
        GemmKey gemm;
        AttentionKey attention;
        double count = 0, seconds = 0;
    };
    std::vector<Shape> gemms, attentions;  // every shape, slowest first
    std::array<double, 3> gemm{};          // seconds of the fwd, dgrad and wgrad GEMMs
    std::array<double, 2> attention{};     // fused attention, forward and backward
    double memory = 0;                     // ptool-counted memory-bound bytes at the streaming bandwidth
    double memory_bytes = 0;               // those bytes
    double kernels = 0;  // memory-bound kernels launched (ptool's, each framework op's sequence)
    std::array<double, kOpClasses> ops{};  // framework ops (OpClass)
    double launch = 0;  // the memory-bound kernels' fixed cost: their count x the table's kernel_overhead
    std::array<bool, kOpClasses> op_measured{};  // the table measured the op (else derived from its bytes)
    double total() const;
};

ComputeTerms compute_terms(const MetaWork& work, const Cluster& c, DType compute);

// How the cluster's kernel times are known, one line: "measured: <table>", "derived from <table>
// (measured on <gpu>) by the peaks: bfloat16 x0.315, memory x0.61", or "assumed: the roofline".
std::string kernel_model_source(const Cluster& c);

}  // namespace ptool
