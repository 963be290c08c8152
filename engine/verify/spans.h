// Where a piece of a tensor lies in the whole one, as contiguous runs of elements: the geometry
// that rank-local comparison (verify/compare.h) and the cut-independent element hash
// (verify/digest.h) walk.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ptool {

// A run of `n` elements from flat index `a` of the piece and `e` of the whole.
struct Span {
    int64_t a, e, n;
};

// The runs of the box of `global` at `offset` with `local`'s shape, in the piece's order (runs
// that touch in both are merged).
std::vector<Span> spans_of(const Shape& local, const Shape& global, const std::vector<int64_t>& offset);

}  // namespace ptool
