// A kernel table (docs/kernel_table.md): what one GPU type's kernels take, measured, not fitted.
// A cluster file names one (`kernels:`); clusters/kernels/h100_sxm5_80gb.json is PyTorch's on an
// H100 (tools/kernel_table_from_anchor.py), `ptool calibrate` writes one for the GPU at hand.
//
//   gemm       seconds per cuBLAS GEMM by (dtype, op: fwd/dgrad/wgrad, m, n, k) in a linear's terms;
//              `float8` rows: torch._scaled_mm's (cuBLASLt) float8 GEMMs writing `dtype`
//   attention  a fused causal attention's forward and forward+backward seconds by (batch, heads,
//              kv heads, sequence, head size)
//   memory     memory-bound kernels: `copy` (the streaming bandwidth, required) and whole framework
//              ops measured as one (the eager RMSNorm, the upcast loss) by elements
//   peak       the vendor's dense FLOP/s per dtype and memory bandwidth the rows were measured
//              against: the scale by which a GPU without a table of its own is derived from this one
//   device     its memory and what the CUDA context took
// Lookups interpolate in log space between the rows (gemm_seconds, attention_flops_per_second);
// every refusal of the file is InputError at its line:column.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backend/meta/meta_backend.h"

namespace ptool {

struct KernelTable {
    std::string path, gpu;
    std::string provenance;              // one line: when, with what, by whom
    std::map<DType, double> peak_flops;  // FLOP/s per dtype
    double float8_peak_flops = 0;        // float8 FLOP/s (`peak`'s `float8`): the float8 rows' scale
    double peak_bandwidth = 0;           // bytes/s
    double device_memory = 0, context_bytes = 0;

    struct Gemm {
        GemmKey key;
        double seconds = 0;
    };
    struct Attention {
        DType dtype = DType::bfloat16;
        bool causal = true;
        int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0;
        double fwd_seconds = 0, fwd_bwd_seconds = 0;
        double fwd_flops() const;  // 4 b h s^2 d, halved when causal (the anchor's count)
    };
    struct MemoryOp {
        std::string op;  // "copy", "add", or an OpClass name; others are kept, unused
        DType dtype = DType::bfloat16;
        double elements = 0, bytes = 0, seconds = 0;
    };
    // The fixed cost of one memory-bound kernel besides its bytes (launch, ramp-up and tail: the
    // alpha of time = alpha + bytes / bandwidth), and where it comes from; 0 when the table has none.
    double kernel_overhead = 0;
    std::string kernel_overhead_source;
    std::vector<Gemm> gemm;
    std::vector<Attention> attention;
    std::vector<MemoryOp> memory;

    bool has_gemm(DType dt) const;
    // Whether it measured float8 GEMMs writing `dt` (torch._scaled_mm's `float8` rows).
    bool has_float8_gemm(DType dt) const;
    // The dtype whose rows price `dt`'s GEMMs: its own, else bfloat16's, else the first measured
    // (scaled by the peaks).
    DType gemm_dtype_for(DType dt) const;
    // Seconds of one GEMM of `key`: the rows of its dtype and op interpolated in log space (the
    // throughput 2mnk/seconds, trilinear in log m, log n, log k over the measured grid; a corner the
    // grid lacks is left out and the rest reweighted); above the grid the throughput stays the
    // largest measured shape's, below it the time stays the smallest's (a smaller GEMM is not
    // faster than the smallest measured: launch-bound). The dtype must have rows (has_gemm).
    double gemm_seconds(const GemmKey& key) const;
    bool has_attention(DType dt) const;
    // FLOP/s of a fused attention kernel of sequence `seq` (its keys), forward or backward (the
    // forward+backward row less the forward: 2.5 times the forward's FLOPs), interpolated in log
    // sequence, constant outside the rows' range; other head sizes at the measured ones' rate.
    double attention_flops_per_second(DType dt, int64_t seq, bool backward) const;
    const MemoryOp* memory_op(const std::string& op, DType dt) const;  // null when not measured
    double stream_bandwidth() const;                                   // copy's bytes/s
};

KernelTable load_kernel_table(const std::string& path);
KernelTable load_kernel_table_text(const std::string& text, const std::string& name);

}  // namespace ptool
