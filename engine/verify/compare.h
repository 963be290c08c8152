// Tensor comparison with torch.testing.assert_close's rule (core/tolerance.h): |a - e| <= atol +
// rtol * |e|, NaN never equal (equal_nan=False). Also reports the ULP distance in the tensors'
// dtype, the headroom (the worst |a - e| / (atol + rtol * |e|); < 1 passes) and the Frobenius
// norms the low-precision rule and the module rule (verify/report.cpp) judge by.
#pragma once

#include "core/tensor.h"
#include "core/tolerance.h"

namespace ptool {

struct TensorDiff {
    bool shape_ok = true;
    // Elements where either side is NaN or infinite. They agree only where both hold the same
    // (NaN and NaN, or the same infinity) at the same place; elsewhere the tensor fails and its
    // errors read nan (a NaN against a number) or inf.
    int64_t nonfinite = 0;
    double max_abs = 0, max_rel = 0, headroom = 0;
    double rel_fro = 0;       // ||a - e||_F / ||e||_F (inf when e is zero and a is not)
    double err_norm = 0, ref_norm = 0;  // ||a - e||_F and ||e||_F (ref_norm 0 for bitwise-equal tensors without rel_fro)
    bool by_frobenius = false;  // failed the elementwise rule, passed by the Frobenius bound
    bool systematic = false;    // a gradient whose every element passed but whose error is beyond rounding
                                // (Tolerance::systematic, judged against its module's in verify/report.cpp)
    bool by_gradients = false;  // a parameter that failed the elementwise rule while its gradients agreed and
                                // its update is the optimizer's on them (verify/report.h, update rule)
    int64_t max_ulp = 0;
    bool pass = true;
};

TensorDiff compare_tensors(const Tensor& actual, const Tensor& expected, const Tolerance& tol);

// The rule for a recorded tensor: the masters' (Tolerance::masters) for step{k}.param.*, else tol.
Tolerance rule_for(const Tolerance& tol, const std::string& key);

// A 64-bit digest of a host tensor's dtype, shape and bytes (multiply-xorshift mixing in four
// lanes of 8 bytes): replicas and construction-time state are compared by digest, so checking a 32 MiB
// gradient moves 8 bytes per rank, not 32 MiB. Equal digests stand for bitwise equality (a
// collision between two different tensors has probability about 2^-64).
uint64_t tensor_digest(const Tensor& t);

}  // namespace ptool
