// Attention's pieces shared by its one-device and allgather path (attention.cpp) and the context
// parallel ring (attention_ring.cpp): head layouts, the kv-head sharing, a flash kernel's head and
// row tiling, and causal masks by position.
#pragma once

#include <functional>
#include <vector>

#include "backend/backend.h"
#include "backend/meta/meta_backend.h"
#include "core/tensor.h"

namespace ptool {

struct ContextShard;

namespace attention_heads {

Tensor split_heads(Backend& be, const Tensor& x, int64_t n);             // [B, T, n*hd] -> [B*n, T, hd]
Tensor merge_heads(Backend& be, const Tensor& x, int64_t b, int64_t n);  // [B*n, T, hd] -> [B, T, n*hd]
Tensor expand_kv(Backend& be, const Tensor& kv, int64_t b, int64_t heads, int64_t kv_heads);  // kv -> q heads
Tensor reduce_kv(Backend& be, const Tensor& d, int64_t b, int64_t heads, int64_t kv_heads);   // its adjoint
// How explain counts a flash head: one fused kernel, its softmax on chip, computing `gemm_share`
// of its products (the causal triangle's), its FLOPs priced as the attention kernel of its phase
// (q: [B*H, T, hd] queries, t_k keys).
MetaKernelMode flash_kernel(bool causal, const Tensor& q, int64_t t_k, bool backward);
void each_head(int64_t n, const Tensor& like, const std::function<void(int64_t)>& body);
void each_row_tile(int64_t t, const Tensor& like, const std::function<void(int64_t, int64_t)>& body);
Tensor head_rows(const Tensor& x, int64_t i, int64_t r0, int64_t n);  // rows [r0, r0+n) of head i: [1, n, hd]
// A mask [1, rows, keys] on like's device: `seen` where visible(query row i, key j), `unseen` elsewhere.
Tensor visible_mask(int64_t rows, int64_t keys, const Tensor& like,
                    const std::function<bool(int64_t, int64_t)>& visible, double seen, double unseen);
// The causal mask [1, rows, keys] of query rows [r0, r0 + rows) against keys in position order
// (cp: the queries at the rank's positions; null: at their rows).
Tensor causal_mask(const ContextShard* cp, int64_t r0, int64_t rows, int64_t keys, const Tensor& like);
// The same for queries at positions queries[r0..r0+rows) against keys at positions `keys`: 0 where
// a key's position is at most the query's, -inf above (a ring block's keys sit anywhere).
Tensor position_mask(const std::vector<int64_t>& queries, int64_t r0, int64_t rows,
                     const std::vector<int64_t>& keys, const Tensor& like);

}  // namespace attention_heads
}  // namespace ptool
