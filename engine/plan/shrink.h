// A proxy of a model for a plan (`ptool shrink`, `ptool plan --verify`): the same module tree and
// names, at most 2 blocks per repeat, and sizes small enough to verify on this machine that still
// split as the plan splits them, so the plan's semantics (styles, sequence parallelism,
// fully_shard, checkpointing, mixed precision, loss_parallel) are checked before a cluster is used.
//
//   attention: kv_heads' = tp when tp divides kv_heads (else kept), heads' keeping the group size,
//              head dim 8; its dim' = heads' x 8 (the lcm when several attentions share a dim)
//   every other size (the keys each module type lists, model/module_type.h: dim, hidden, in, out,
//              vocab, features): the k-th distinct value, smallest
//              first, becomes lcm(tp, 8) x k, so equal sizes stay equal and every size divides by tp
//   batch: rows = dp x gradient_accumulation x 2 (the plan's gradient_accumulation over the model's,
//              which the proxy then says too); tokens' sequence (or a float input's middle dims)
//              2 x tp, the sequence (dim 1) times cp's chunks under context parallel (cp, or 2 x cp
//              load-balanced); the last dim of a float input as the sizes above
// A pipeline plan's proxy keeps one block per stage (at least 2) and rows for the plan's
// microbatches, 2 rows each per data rank; its stages are then cut one block each (layers_per_stage
// 1: ptool plan --verify rewrites the plan so), the stage count and schedule kept.
// Numbers change, structure and divisibility do not: a proxy that passes says the plan computes
// what the single-device model computes, not that the real model fits (ptool plan's memory says).
#pragma once

#include <string>

#include "parallel/plan.h"

namespace ptool {

// The model's text (YAML, comments dropped) with every repeat of 4 or more blocks at `count` blocks
// (0: as written), gradient_accumulation `microbatches` and, given rows > 0, a batch of `rows` rows:
// the planner's variants of a model.
std::string model_variant(const std::string& text, int64_t count, int64_t microbatches, int64_t rows = 0);

// The proxy's YAML text. `model_text` must load (the model loader's errors are the caller's).
std::string shrink_model(const std::string& model_text, const std::string& name, const Plan& plan);

}  // namespace ptool
