// Layout operations on tensors of either device: torch.chunk along any dim, concatenation, and
// the packing that lets a dim-0 collective carry shards of another dim.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace ptool {

int64_t normalize_dim(int64_t dim, int64_t ndim);  // negative counts from the end; throws when out of range

// The flat index of the first NaN or infinite element of a host tensor, -1 when every one is finite.
int64_t first_nonfinite(const Tensor& t);

// torch.chunk semantics: chunks of ceil(n / parts) elements, the last ones shorter or empty.
struct Chunk {
    int64_t offset, length;
};
Chunk chunk_of(int64_t n, int parts, int index);

Tensor cat(const std::vector<Tensor>& pieces, int64_t dim);
// torch.chunk(t, parts, dim)[index] as a contiguous tensor (possibly empty).
Tensor chunk(const Tensor& t, int parts, int index, int64_t dim);

// Collectives split dim 0. To shard along dim d, the full tensor [P, M, Q] (M = size(d)) is packed
// as [M, P * Q] whose rows chunk_of(M, parts, r) hold chunk r's bytes exactly as the contiguous
// tensor chunk(t, parts, r, d) lays them out: so a rank's shard is its reduce_scatter rows, and
// the shards' all_gather (each shard viewed as [m_r, P * Q]) is the packed tensor. One strided
// copy per chunk, as wide as the chunk's rows of Q elements; on any device.
Tensor pack_chunks(const Tensor& t, int parts, int64_t dim);
// The inverse: the tensor of `shape` from its packed chunks along dim.
Tensor unpack_chunks(const Tensor& packed, const Shape& shape, int parts, int64_t dim);

}  // namespace ptool
