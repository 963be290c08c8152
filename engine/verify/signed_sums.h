// The exact signed sums a comparison keeps beside its maxima and Frobenius sums, where its rule
// asks for them (verify/compare.h's Tolerance): a model output's a - e (signed_sum) and a clipped
// model's gradient's e (a - e) (projected), each as its positive and negative terms apart.
#pragma once

#include <vector>

#include "verify/compare.h"
#include "verify/spans.h"

namespace ptool {

// Adds to `p` the sums `tol` asks for over the spans' elements, in one pass: with signed_sum, the
// sums of a - e where positive, of e - a where positive and of |e|; with projected, the sums of
// e (a - e) where positive and of -e (a - e) where positive. Non-finite terms are left out (the
// piece fails on them already). Same-dtype float tensors on the CPU are read as they are.
void add_signed_sums(const Tensor& actual, const Tensor& expected, const std::vector<Span>& spans,
                     const Tolerance& tol, DiffPiece& p);

}  // namespace ptool
