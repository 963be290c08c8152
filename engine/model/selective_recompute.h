// Selective activation checkpointing at op level, torchtitan's policy (its `_save_list` and
// `_custom_policy`, torch.utils.checkpoint's create_selective_checkpoint_contexts): inside a
// checkpointed region the outputs of some ops are kept from the forward, and the recompute in
// backward takes them instead of running those ops again; every other op is recomputed.
//
//   kept: every second matmul (aten.mm: the 1st, 3rd, 5th ... of a region's pass, counted in
//         call order; a Linear without a bias is one, a Linear with its bias is aten.addmm, which
//         is neither counted nor kept), and scaled-dot-product attention's output (the flash
//         kernel: an Attention with flash; eager attention is bmm and softmax, not kept).
//   recomputed: everything else (norms, activations, rope, the other matmuls).
//
// The count restarts for the region's forward and for its recompute, so both passes make the same
// decisions in the same order (the recompute runs the forward's code). Values are the forward's
// bitwise: a kept output is the tensor the forward computed, and the recompute of the rest runs
// the same ops on the same inputs (dropout's masks are drawn by index: core/rng.h).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <utility>

#include "core/tensor.h"

namespace ptool {

struct RunContext;  // model/module.h

// One pass (forward or recompute) of an op-policy region: its matmuls so far, and which call of
// the region it is (the forward's number, handed to its recompute: a module checkpointed at two
// call sites, `shared`, keeps each call's outputs apart, and the backward recomputes the last
// call first).
struct SelectiveRegion {
    int matmuls = 0;
    uint64_t call = 0;
};

// A number for a region's forward, unique in the process.
uint64_t next_selective_call();

enum class SelectiveOp { mm, addmm, attention };

// What an op does with its output under the policy: nothing (not in a region, or recomputed),
// keep it (the region's forward), or take the one kept (the region's recompute).
enum class KeptOutput { none, keep, take };

// The decision for one op call; counts matmuls. Called once per op call in both passes.
KeptOutput kept_output(RunContext& ctx, SelectiveOp op);

// An op's kept outputs, per microbatch and region call (ctx.selective's), first in first out: the
// recompute takes them in the order the forward kept them (a module called twice in one region
// takes its first output first).
class KeptOutputs {
public:
    void keep(const RunContext& ctx, const Tensor& y);
    Tensor take(const RunContext& ctx);
    // The output kept last for `microbatch` (null: none waits): fault injection's seam
    // (verify/faults.h sac_stale_output replaces it).
    Tensor* last(int microbatch);

private:
    using Key = std::pair<int, uint64_t>;  // microbatch, region call
    std::map<Key, std::deque<Tensor>> kept_;
    std::map<int, Key> last_;  // per microbatch: where it kept last
};

}  // namespace ptool
