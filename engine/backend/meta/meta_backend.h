// The meta backend: every op of the Backend interface on meta tensors (core/device_memory.h),
// computing nothing and counting what it would cost: the GEMMs' FLOPs and the bytes the other
// ops read and write. train/simulate.h executes a training step with it to predict a rank's
// memory (the tensors the step allocates) and time (its work at a device's rates).
#pragma once

#include <functional>

#include "backend/backend.h"

namespace ptool {

// What the ops the calling thread ran on the meta backend would cost, since the last reset.
struct MetaWork {
    double gemm_flops = 0;       // 2 * M * N * K per GEMM (batched: per batch)
    double recompute_flops = 0;  // the part of gemm_flops run while recomputing (activation checkpointing)
    bool recomputing = false;
    // a GEMM that stands for an element-wise op (MetaGemmAsElementwise): bytes, not FLOPs
    bool gemm_as_elementwise = false;
    // inside a fused kernel (MetaFusedKernel): the share of its GEMM FLOPs it runs, and no bytes
    // for the element-wise ops between them (they stay on chip)
    double gemm_share = 1;
    bool on_chip = false;
    double memory_bytes = 0;  // bytes every other op reads and writes (its tensors' sizes)
    int64_t kernels = 0;      // ops launched
};
MetaWork& meta_work();  // the calling thread's
// What `after` counted beyond `before` (the work read twice: the work between).
MetaWork work_since(const MetaWork& before, const MetaWork& after);

// Runs `slice` once and counts its work `n` times: n slices of one computation that allocate and free
// alike (flash attention's heads), so one of them gives the memory peak and n of them the work.
void meta_repeat(int64_t n, const std::function<void()>& slice);

// While in scope, the calling thread's GEMMs count as the element-wise op they compute: their
// input's and output's bytes, no FLOPs. RoPE's rotate_half is a product with a signed permutation
// matrix in ptool (exact, any backend) and a slice-and-concatenate in PyTorch, which no GEMM
// efficiency describes.
class MetaGemmAsElementwise {
public:
    MetaGemmAsElementwise() : saved_(meta_work().gemm_as_elementwise) {
        meta_work().gemm_as_elementwise = true;
    }
    ~MetaGemmAsElementwise() { meta_work().gemm_as_elementwise = saved_; }
    MetaGemmAsElementwise(const MetaGemmAsElementwise&) = delete;
    MetaGemmAsElementwise& operator=(const MetaGemmAsElementwise&) = delete;

private:
    bool saved_;
};

// While in scope the calling thread's work is one fused kernel's, as FlashAttention runs a head:
// its GEMMs' FLOPs times `gemm_share` (a causal kernel skips the tiles above the diagonal: (T + 1)
// / 2T of the T x T products), and the softmax between them costs no memory traffic (its T x T
// tiles live in on-chip memory).
class MetaFusedKernel {
public:
    explicit MetaFusedKernel(double gemm_share)
        : saved_share_(meta_work().gemm_share), saved_on_chip_(meta_work().on_chip) {
        meta_work().gemm_share = gemm_share, meta_work().on_chip = true;
    }
    ~MetaFusedKernel() { meta_work().gemm_share = saved_share_, meta_work().on_chip = saved_on_chip_; }
    MetaFusedKernel(const MetaFusedKernel&) = delete;
    MetaFusedKernel& operator=(const MetaFusedKernel&) = delete;

private:
    double saved_share_;
    bool saved_on_chip_;
};

Backend& meta_backend();

}  // namespace ptool
