// The meta backend: every op of the Backend interface on meta tensors (core/device_memory.h),
// computing nothing and counting what it would cost: each GEMM by its shape, flash attention's
// fused kernels by their sequence and head size, and the bytes the other ops read and write, by
// the class of kernel that moves them. train/simulate.h executes a training step with it to predict
// a rank's memory (the tensors the step allocates) and time (the kernel model of plan/kernel_model.h
// prices what was counted here).
#pragma once

#include <compare>
#include <functional>
#include <map>
#include <optional>

#include "backend/backend.h"

namespace ptool {

// The three GEMMs of a linear layer y = x W^T (x: [m, k], W: [n, k]), as cuBLAS runs them and the
// kernel table measures them: the forward (x @ W^T), the input's gradient (dY @ W) and the weight's
// (dY^T @ X). A GEMM's op follows from its layout (Backend::gemm's transposes): b transposed is a
// forward, a transposed a weight gradient, neither an input gradient.
enum class GemmOp : uint8_t { fwd, dgrad, wgrad };
const char* gemm_op_name(GemmOp op);

// One GEMM shape, in its linear's terms: m rows (tokens), n outputs, k inputs (for dgrad the
// product is [m, k] reducing over n; for wgrad [n, k] reducing over m). A batched GEMM counts its
// batch into m.
struct GemmKey {
    GemmOp op = GemmOp::fwd;
    DType dtype = DType::float32;
    int64_t m = 0, n = 0, k = 0;
    // a float8 GEMM (torchao's tensorwise: float8 operands, `dtype` its output's): priced at the
    // kernel table's float8 rows where it has them
    bool float8 = false;
    auto operator<=>(const GemmKey&) const = default;
};

// One fused attention kernel's work (FlashAttention, SDPA): its phase, the sequence lengths of its
// queries and keys, its head size and causality; the value counted is the kernel's FLOPs.
struct AttentionKey {
    bool backward = false;
    DType dtype = DType::float32;
    bool causal = false;
    int64_t seq_q = 0, seq_k = 0, head_dim = 0;
    auto operator<=>(const AttentionKey&) const = default;
};

// Memory-bound work a framework runs as its own kernel sequence, which ptool's kernels do not
// mirror: counted by its elements, priced by plan/kernel_model.h from the bytes the framework's
// kernels move (or a measurement of the whole sequence). Everything else a meta op touches is
// `memory_bytes`, priced as bytes over the streaming bandwidth.
enum class OpClass : uint8_t {
    rms_norm_eager_fwd,  // transformers' LlamaRMSNorm: upcast, pow, mean, rsqrt, mul, cast, mul by weight
    rms_norm_eager_bwd,
    cross_entropy,  // the loss's forward and backward with the logits upcast to float32 (elements of the
                    // logits)
    adamw_foreach,  // torch.optim.AdamW(foreach=True)'s update (parameter elements)
    adamw_fused,    // torch.optim.AdamW(fused=True)'s: one kernel reading p, g, m, v and writing p, m, v
    // torchao's tensorwise float8 cast of a tensor (model/float8_cost.h; elements of the tensor cast):
    float8_amax_tensorwise,  // its scale: torch.max(torch.abs(x)) and amax_to_scale's scalar kernels
    float8_cast_tensorwise,  // the scaled cast: x.to(float32) * scale, clamp, .to(float8)
    // the same under torch.compile (the plan's `compile`): inductor's fused kernels
    float8_amax_compiled,  // one reduction of abs(x), its scale computed in the epilogue's kernel
    float8_cast_compiled,  // one pointwise kernel: x * scale, clamp, cast, in the layout the GEMM takes
    count_
};
constexpr int kOpClasses = static_cast<int>(OpClass::count_);
const char* op_class_name(OpClass c);

struct OpKey {
    OpClass op = OpClass::rms_norm_eager_fwd;
    DType dtype = DType::float32;  // of the op's input (the logits before any upcast; the parameters)
    auto operator<=>(const OpKey&) const = default;
};
struct OpCount {  // a framework op's elements and the kernels its sequence launched
    double elements = 0, kernels = 0;
    OpCount& operator+=(const OpCount& o) {
        elements += o.elements, kernels += o.kernels;
        return *this;
    }
    OpCount operator*(double k) const { return {elements * k, kernels * k}; }
};

// How the meta backend counts what the calling thread runs: a GEMM that stands for an element-wise
// op (RoPE's rotate_half, a product with a signed permutation matrix in ptool, exact on every
// backend, and a slice-and-concatenate in PyTorch: bytes, not FLOPs), or the inside of a fused
// kernel as FlashAttention runs a head (its GEMMs' FLOPs times `gemm_share`: a causal kernel skips
// the tiles above the diagonal, (T + 1) / 2T of the T x T products; the softmax between them stays
// in on-chip memory: no bytes, no launches of its own). With `attention` set, the fused kernel's
// FLOPs are counted under that key (priced by the attention table), not as GEMMs. A composite op
// counted by its own OpClass (meta_count_op) runs ptool's kernels `on_chip`: their bytes are not
// counted again; so do an emulated float8 GEMM's epilogue and its other emulation-only kernels
// (model/float8_cost.h: torch._scaled_mm scales and casts its output on chip). `gemm_dtype` and
// `gemm_float8` count a GEMM as another dtype's than its operands' (a float8 GEMM emulated on
// float32 values, model/float8_gemm.h: float8, its output's dtype).
struct MetaKernelMode {
    bool gemm_as_elementwise = false;
    double gemm_share = 1;
    bool on_chip = false;
    bool attention = false;
    AttentionKey attention_key{};
    std::optional<DType> gemm_dtype{};
    bool gemm_float8 = false;
};

// What the ops the calling thread ran on the meta backend would cost, since the last reset.
struct MetaWork {
    double gemm_flops = 0;       // 2 * M * N * K per GEMM (batched: per batch); fused attention's too
    double recompute_flops = 0;  // the part of gemm_flops run while recomputing (activation checkpointing)
    bool recomputing = false;
    MetaKernelMode mode;                       // set by MetaKernelScope
    double memory_bytes = 0;                   // bytes every other op reads and writes (its tensors' sizes)
    double kernels = 0;                        // the memory-bound ops' launches (GEMMs are counted by shape)
    std::map<GemmKey, double> gemms;           // calls per shape
    std::map<AttentionKey, double> attention;  // fused attention FLOPs per kernel shape
    std::map<OpKey, OpCount> ops;              // per framework op class
};
MetaWork& meta_work();  // the calling thread's
// What `after` counted beyond `before` (the work read twice: the work between).
MetaWork work_since(const MetaWork& before, const MetaWork& after);
// a + (b - a) * k, count by count: the work of a model with more blocks (plan/search.h).
MetaWork work_extrapolated(const MetaWork& a, const MetaWork& b, double k);
// a's counts plus b's times k.
void add_work(MetaWork& a, const MetaWork& b, double k = 1);

// Bytes per element a framework's kernel sequence for `op` moves (PyTorch's eager kernels: every
// read and write of each kernel; meta_backend.cpp lists the sequences), for inputs of `dt`; and the
// kernels that sequence launches per call (a float8 cast of a float32 tensor skips its upcast).
double framework_bytes(OpClass op, DType dt);
int framework_kernels(OpClass op, DType dt);

// Counts `elements` of a framework op (OpClass) on the calling thread, with one launch per kernel
// of its sequence (`kernels`).
void meta_count_op(OpClass op, DType dtype, double elements, int kernels);
// Counts memory-bound kernels no meta op stands for (torch._scaled_mm's layout copies,
// model/float8_cost.h): `bytes` read and written, `kernels` launches.
void meta_count_memory(double bytes, int kernels);

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
