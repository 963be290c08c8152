// The meta backend: every op of the Backend interface on meta tensors (core/device_memory.h),
// computing nothing and counting what it would cost: the GEMMs' FLOPs and the bytes the other
// ops read and write. train/simulate.h executes a training step with it to predict a rank's
// memory (the tensors the step allocates) and time (its work at a device's rates).
#pragma once

#include <functional>

#include "backend/backend.h"

namespace ptool {

// How the meta backend counts what the calling thread runs: a GEMM that stands for an element-wise
// op (RoPE's rotate_half, a product with a signed permutation matrix in ptool, exact on every
// backend, and a slice-and-concatenate in PyTorch: bytes, not FLOPs), or the inside of a fused
// kernel as FlashAttention runs a head (its GEMMs' FLOPs times `gemm_share`: a causal kernel skips
// the tiles above the diagonal, (T + 1) / 2T of the T x T products; the softmax between them stays
// in on-chip memory: no bytes, no launches of its own).
struct MetaKernelMode {
    bool gemm_as_elementwise = false;
    double gemm_share = 1;
    bool on_chip = false;
};

// What the ops the calling thread ran on the meta backend would cost, since the last reset.
struct MetaWork {
    double gemm_flops = 0;       // 2 * M * N * K per GEMM (batched: per batch)
    double recompute_flops = 0;  // the part of gemm_flops run while recomputing (activation checkpointing)
    bool recomputing = false;
    MetaKernelMode mode;      // set by MetaKernelScope
    double memory_bytes = 0;  // bytes every other op reads and writes (its tensors' sizes)
    int64_t kernels = 0;      // ops launched
};
MetaWork& meta_work();  // the calling thread's
// What `after` counted beyond `before` (the work read twice: the work between).
MetaWork work_since(const MetaWork& before, const MetaWork& after);

// Runs `slice` once and counts its work `n` times: n slices of one computation that allocate and free
// alike (flash attention's heads), so one of them gives the memory peak and n of them the work.
void meta_repeat(int64_t n, const std::function<void()>& slice);

// The calling thread's kernel mode while in scope, restored after:
//   MetaKernelScope elementwise({.gemm_as_elementwise = true});
//   MetaKernelScope flash({.gemm_share = (t + 1.0) / (2 * t), .on_chip = true});
class MetaKernelScope {
public:
    explicit MetaKernelScope(MetaKernelMode mode) : saved_(meta_work().mode) { meta_work().mode = mode; }
    ~MetaKernelScope() { meta_work().mode = saved_; }
    MetaKernelScope(const MetaKernelScope&) = delete;
    MetaKernelScope& operator=(const MetaKernelScope&) = delete;

private:
    MetaKernelMode saved_;
};

Backend& meta_backend();

}  // namespace ptool
