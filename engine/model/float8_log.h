// Near-tie-aware float8 verdicts (docs/float8.md). A float8 cast rounds to a grid an eighth
// (e4m3fn) or a quarter (e5m2) of a binade apart, so two values that agree to rounding can still
// round to neighbouring grid points: a correct parallel run whose activation before a cast differs
// from the reference's by one float32 (or bf16) rounding turns that into a whole float8 step
// wherever the value sat at a rounding boundary, and a verdict at the compute dtype's rule fails it.
//
// The reference logs each float8 linear's operands as they reach their casts, before rounding
// (its input and its output's gradient per step, microbatch and linear; its weight per step and
// linear). They stay until verify is done with the reference: float32 copies of every float8
// operand of every step, verification's memory, not the run's. The parallel run
// looks each element of its own operand up (its global token: the data rank's rows, the cp rank's
// positions, the tp rank's chunk where tp cuts the tokens; its feature or weight row by the tp
// chunk) and casts the reference's value r instead of its own v where the two agree within verify's
// elementwise tolerance of the compute dtype, its atol taken relative to A, the smaller of the
// largest magnitudes of r's row and of its column (a cast's grid is relative to its row's, its
// column's or its group's scale, and gradients are small): |v - r| <= rtol |r| + atol A, both
// finite. Its own amax and scale stay, so a wrong scale, format or amax group
// changes the cast as before; a value further off is its own, so a real difference shows where it
// arises. An output gradient is compared at the rank's scale (Run::activation_grad_scale).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace ptool {

// Which of a float8 linear's operands: its input (the forward's and the weight gradient's), its
// weight (the forward's and the input gradient's), its output's gradient (both backward GEMMs').
enum class Float8Role { input, weight, grad_output };

// One operand as the reference held it, [rows * seq, cols] row-major in float32: an activation's
// tokens from global row first_row, seq positions each; a weight's rows (first_row 0, seq 1).
struct Float8Logged {
    int64_t first_row = 0, seq = 1, rows = 0, cols = 0;
    std::vector<float> values;
    // each row's and each column's largest magnitude (NaN where one holds a NaN): the scale a
    // follow's atol is taken at, the smaller of its element's two (model/float8_log.h)
    std::vector<float> row_amax, col_amax;
    void measure();  // row_amax and col_amax from values
};

class Float8Log {
public:
    Float8Log(double rtol, double atol) : rtol_(rtol), atol_(atol) {}
    double rtol() const { return rtol_; }
    double atol() const { return atol_; }
    // The plan's that follows it (one reference can serve plans whose verify tolerances differ).
    void set_tolerance(double rtol, double atol) { rtol_ = rtol, atol_ = atol; }
    // The reference's (a recompute's call is the same as the call it recomputes: not logged again).
    void record(int64_t step, int microbatch, const std::string& fqn, Float8Role role, Float8Logged v);
    // The parallel run's: the reference's operand, or null.
    const Float8Logged* find(int64_t step, int microbatch, const std::string& fqn, Float8Role role) const;
    int64_t operands() const;  // logged
    void count_taken(int64_t n) { taken_ += n; }
    void reset_taken() { taken_ = 0; }
    int64_t taken() const { return taken_; }
    // As int64 words and back, the tolerance with them (the reference on rank 0, every rank of an
    // mpirun job).
    std::vector<int64_t> words() const;
    void read_words(const std::vector<int64_t>& w);

private:
    using Key = std::tuple<int64_t, int, std::string, int>;
    double rtol_, atol_;
    mutable std::mutex mutex_;
    std::map<Key, Float8Logged> operands_;
    std::atomic<int64_t> taken_{0};
};

}  // namespace ptool
