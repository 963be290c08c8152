// The elementwise tolerance of the CUDA tests (test_cuda_backend.cpp: a GPU result against the CPU
// oracle's), kept here so that it is tested on every machine (test_tensor.cpp).
#pragma once

#include <cmath>

namespace ptool::testing {

// |a - b| <= atol + rtol |a| between finite values; a non-finite value matches only itself (the
// same infinity, NaN and NaN). |a - b| of two equal infinities is NaN, which no tolerance admits
// (the H100 run of 2026-11-27 failed softmax_stats' m on its fully masked row, -inf on both sides,
// as "1 of 6 elements out of tolerance, worst 0": std::max had dropped the NaN), and rtol |a| of
// an infinite a admits anything.
inline bool close_enough(double a, double b, double atol, double rtol) {
    if (!std::isfinite(a) || !std::isfinite(b)) return a == b || (std::isnan(a) && std::isnan(b));
    return std::abs(a - b) <= atol + rtol * std::abs(a);
}

}  // namespace ptool::testing
