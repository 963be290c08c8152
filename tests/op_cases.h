// The Backend's op cases, one table (as ggml's test-backend-ops drives every op from one list of
// cases): each row names an op of backend.h and makes its cases in a dtype, each case drawing its
// inputs from CounterRng (deterministic: every backend gets the same values), putting them on a
// backend, running the op there and returning what it wrote, each output with the tolerance a
// device's result is held to against the CPU's (the oracle). Driven from it:
//   test_cuda_backend  every case on the GPU against the CPU (GPU machines)
//   test_op_cases      every op of backend.h has a row; every case finite on the CPU; on the meta
//                      backend the CPU's shapes and dtypes, and its work counted (the planner's costs)
//   bench/bench_ops    every case timed against the sgemm and memcpy rates of the same run
// docs/testing.md says how a new op gets its row.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ptool::testing {

// A device result's relative tolerance against the CPU's in each dtype (close_enough.h's rtol).
double rtol_of(DType dt);

// How a backend's output is held to the CPU's: close (close_enough: |a - b| <= atol + rtol |a|),
// bitwise (draw_init's promise), or row_sums (a fused kernel's row sums l against an oracle that
// rounds its bfloat16 scores: attention_oracle.h's bf16_row_sum_bound for the rows' m and keys).
struct OpTolerance {
    enum class Kind { close, bitwise, row_sums };
    Kind kind = Kind::close;
    double atol = 1e-5;
    double rtol = -1;    // < 0: rtol_of(the output's dtype)
    Tensor row_max;      // row_sums: the reference's m
    int64_t keys = 0;    // row_sums: the keys each row sees
    bool finite = true;  // false: the op's contract puts -inf here (a fully masked row's m)
};

struct OpOutput {
    std::string name;  // the op's parameter ("dw"), or "loss" for what it returns
    Tensor value;      // on the backend's device; a returned value: a 0-d float64 host tensor
    OpTolerance tol;
};

// One case set up on one backend: its inputs already there.
struct OpRun {
    std::function<void()> op;                        // the op (the bench runs it again and again)
    std::function<std::vector<OpOutput>()> outputs;  // what it wrote, read after op()
};

// A GEMM case's shape: the bench times sgemm (cuBLAS on the GPU) on it for the limit.
struct GemmShape {
    int64_t batch = 1, m = 0, n = 0, k = 0;
    bool trans_a = false, trans_b = false;
};

struct OpCase {
    std::string label;                                // the shape and flags: "[3, 33, 129] ta=1"
    std::function<OpRun(Backend&)> setup;             // draws the inputs, puts them on the backend
    std::function<bool(const Backend&)> compared_on;  // unset: every backend (fused attention: where
                                                      // the backend has the kernel)
    std::optional<GemmShape> gemm;
};

inline OpCase op_case(std::string label, std::function<OpRun(Backend&)> setup) {
    OpCase c;
    c.label = std::move(label);
    c.setup = std::move(setup);
    return c;
}

struct OpRow {
    std::string op;                                   // Backend's member function
    std::function<std::vector<OpCase>(DType)> cases;  // its cases in one dtype of kOpDtypes
    std::string meta_counts_nothing;                  // why the meta backend counts no work, if it doesn't
};

inline constexpr DType kOpDtypes[] = {DType::float32, DType::float64, DType::bfloat16};

const std::vector<OpRow>& op_table();

// Backend's members that compute nothing, so have no row: what a backend is and what it can run.
const std::set<std::string>& backend_queries();
// The names of the virtual member functions of class Backend in backend.h's text (the destructor
// left out), in order: what test_op_cases holds the table's rows to.
std::vector<std::string> backend_virtuals(const std::string& header_text);

// `value` (any device) against the reference output (the CPU's) by the reference's tolerance.
struct OpComparison {
    int64_t bad = 0, total = 0;
    double worst = 0;  // the worst difference (row_sums: as a multiple of the bound); NaN where one side is
    std::string message;  // "mse dout in float32: 1 of 527 elements out of tolerance, worst 0.2"
};
OpComparison compare_output(const OpOutput& reference, const Tensor& value, const std::string& what);

// Inputs: uniform in [lo, hi) by element index, from CounterRng(seed, 7); ids below vocab (int64)
// from CounterRng(seed, 9): the values test_cuda_backend always drew.
Tensor uniform_tensor(const Shape& s, DType dt, uint64_t seed, double lo = -2.0, double hi = 2.0);
Tensor id_tensor(const Shape& s, int64_t vocab, uint64_t seed);
// A host tensor on be's device (itself on the CPU: every setup draws its own).
Tensor place(Backend& be, const Tensor& host);
// The CPU backend: where a case computes the inputs its op takes from another op (a norm's
// statistics), so that every backend gets the same ones.
Backend& host_backend();

// The rows, by family (op_cases_*.cpp).
std::vector<OpRow> gemm_rows();
std::vector<OpRow> elementwise_rows();
std::vector<OpRow> exact_rows();
std::vector<OpRow> norm_rows();
std::vector<OpRow> softmax_rows();
std::vector<OpRow> attention_rows();
std::vector<OpRow> loss_optimizer_rows();

}  // namespace ptool::testing
