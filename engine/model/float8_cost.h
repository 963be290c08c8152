// What torchao's float8 kernels cost, counted on the meta backend (backend/meta/meta_backend.h):
// explain prices a float8 linear by the kernels torchao launches in eager mode, not by the ones its
// emulation (model/float8_gemm.h) runs. Each function counts only for a meta tensor (a real run
// counts nothing); the emulation calls them where it casts, so a recompute counts its casts again.
//
// torchao's kernels (float8_linear.py's matmul_with_hp_or_float8_args, float8_ops.py):
//   - a dynamic tensorwise cast (hp_tensor_to_float8_dynamic) of a tensor of dtype s bytes: its
//     scale (OpClass float8_amax_tensorwise: abs and max over the tensor, the scalar kernels of
//     amax_to_scale), then the scaled cast (float8_cast_tensorwise: x.to(float32) * scale, clamp,
//     .to(float8)), by the tensor's elements. Per linear and step: the forward casts the input and
//     the weight; the backward the output gradient and the weight (for dgrad), the output gradient
//     and the input again (for wgrad: torchao recasts, it does not keep the forward's). A weight
//     FSDP2 gathered in float8 is cast on its shard before the gather (fully_shard's unshard: the
//     amax unless precomputed, then the cast) and not by the linear.
//   - torch._scaled_mm takes its first operand row-major and its second column-major
//     (preprocess_addmm copies the other layout): dgrad copies the float8 weight, wgrad the float8
//     output gradient and input. Counted as plain memory-bound bytes: 1 byte read and 1 written an
//     element, one kernel each.
//   - precompute_float8_dynamic_scale_for_fsdp: torch._foreach_norm(ord=inf) reads every float8
//     weight's shard once; its scalars' kernels (stack, clamp, divide, cast) and the norm's two
//     launches: plain memory-bound bytes and six kernels a call.
// Not counted (Float8EmulationOnly): the emulation's own work, which torchao does not launch: the
// float32 product scaled and cast to the output's dtype (torch._scaled_mm's on-chip epilogue) and
// the weight gradient's accumulation (autograd hands the GEMM's output over as the gradient; the
// plain linear's GEMM into its gradient counts no bytes either). Their allocations stay: a
// simulation holds what a run holds.
#pragma once

#include <vector>

#include "backend/meta/meta_backend.h"

namespace ptool {

// x's dynamic tensorwise cast: its amax and scale, then the scaled cast.
void float8_count_cast(const Tensor& x);
// The scaled cast alone, of x with a scale already taken (fully_shard's pre-all-gather cast).
void float8_count_scaled_cast(const Tensor& x);
// The amax and scale alone (fully_shard's pre-all-gather, unless precomputed).
void float8_count_amax(const Tensor& x);
// precompute_float8_dynamic_scale_for_fsdp's amaxes of the float8 weights' shards.
void float8_count_precompute(const std::vector<Tensor>& shards);
// torch._scaled_mm's layout copies for op(a) op(b), a and b the float8 operands' values.
void float8_count_layouts(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b);

// torch.compile (the plan's `compile`), while in scope on the calling thread: inductor fuses each
// cast into an amax reduction and one pointwise kernel writing the float8 layout the GEMM takes
// (OpClass float8_amax_compiled, float8_cast_compiled; no layout copies). The rest of the step is
// priced eager either way (compile would fuse more: the time errs slow).
class Float8Compiled {
public:
    explicit Float8Compiled(bool on);
    ~Float8Compiled();
    Float8Compiled(const Float8Compiled&) = delete;
    Float8Compiled& operator=(const Float8Compiled&) = delete;

private:
    bool before_;
};

// The emulation's own kernels, run while in scope: their tensors allocated, their work not counted.
class Float8EmulationOnly {
private:
    MetaKernelScope scope_{MetaKernelMode{.on_chip = true}};
};

}  // namespace ptool
