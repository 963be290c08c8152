// Layout operations on host tensors: moving a dim, concatenating and chunking along any dim.
// What sharding along a dim other than 0 needs (collectives work on dim 0).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace ptool {

int64_t normalize_dim(int64_t dim, int64_t ndim);  // negative counts from the end; throws when out of range
Tensor movedim(const Tensor& t, int64_t from, int64_t to);  // a contiguous copy (view when from == to)
Tensor cat(const std::vector<Tensor>& pieces, int64_t dim);
// torch.chunk(t, parts, dim)[index] as a contiguous tensor (possibly empty).
Tensor chunk(const Tensor& t, int parts, int index, int64_t dim);

}  // namespace ptool
