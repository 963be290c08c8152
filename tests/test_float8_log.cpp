// Near-tie-aware float8 verdicts (model/float8_log.h): the reference logs a float8 linear's operands
// before their casts; a parallel run casts the reference's value where its own agrees within the
// tolerance, so that a value one rounding off at a float8 rounding boundary rounds as the
// reference's did, while a value further off, or a piece looked up at the wrong place, is its own.
#include <cmath>
#include <limits>

#include "model/float8_gemm.h"
#include "model/float8_linear.h"
#include "model/float8_log.h"
#include "model/module.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_float8_log {

namespace {

// [4, 8] with |x| <= 448 (so the tensorwise e4m3fn scale is 1) and x[1][3] = 1.0625, halfway
// between e4m3fn's 1 and 1.125 (a tie: it rounds to even, 1)
Tensor at_a_tie() {
    Tensor x({4, 8}, DType::float32);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.25 * static_cast<double>(i % 7) - 0.5);
    x.set(0, 448.0);
    x.set(1 * 8 + 3, 1.0625);
    return x;
}

RunContext context(Float8Log& log, bool replays) {
    RunContext ctx;
    ctx.backend = &backend_for(Device::cpu);
    ctx.float8_log = &log, ctx.float8_replays = replays;
    return ctx;
}

Tensor forward(RunContext& ctx, const Float8Gemms& f, const Tensor& x, const Tensor& w) {
    Tensor y({x.size(0), w.size(0)}, DType::float32);
    float8_forward(ctx, f, x, Parameter{w, {}}, y);
    return y;
}

}  // namespace

TEST_CASE(
    "a parallel float8 cast takes the reference's value at a near-tie within tolerance and its own beyond",
    "[cpu]") {
    Float8Gemms f;
    f.fqn = "proj";
    Tensor w({2, 8}, DType::float32);
    for (int64_t i = 0; i < w.numel(); ++i) w.set(i, 0.125 * static_cast<double>(1 + i % 3));
    Float8Log log(1e-6, 1e-9);
    RunContext ref = context(log, false);
    const Tensor x = at_a_tie();
    const Tensor want = forward(ref, f, x, w);
    CHECK(log.operands() == 2);  // the input and the weight
    const Float8Logged* logged = log.find(0, 0, "proj", Float8Role::input);
    REQUIRE(logged);
    CHECK(logged->values[11] == 1.0625f);
    CHECK(logged->row_amax[0] == 448.0f);  // the scale its atol is taken at: row 0 and column 0's
    CHECK(logged->col_amax[0] == 448.0f);
    CHECK(logged->row_amax[1] == 1.0625f);

    // one float32 ulp above the tie: e4m3fn's 1.125 on its own, the reference's 1 when followed
    Tensor nudged = x.clone();
    nudged.set(11, std::nextafter(1.0625f, 2.0f));
    Float8Log none(1e-6, 1e-9);
    RunContext alone = context(none, true);  // a log without the reference's operands: its own values
    CHECK_FALSE(same_bits(forward(alone, f, nudged, w), want));
    RunContext par = context(log, true);
    CHECK(same_bits(forward(par, f, nudged, w), want));
    CHECK(log.taken() == 1);

    // beyond rtol (1e-6 of 1.0625): its own value, another number
    Tensor far = x.clone();
    far.set(11, 1.0625 * (1 + 1e-5));
    log.reset_taken();
    CHECK_FALSE(same_bits(forward(par, f, far, w), want));
    CHECK(log.taken() == 0);

    // infinities in the reference's row and column of the tie: no bound, nothing agreed there
    Tensor with_inf = x.clone();
    with_inf.set(1 * 8 + 0, std::numeric_limits<double>::infinity());
    with_inf.set(2 * 8 + 3, -std::numeric_limits<double>::infinity());
    Float8Log inf_log(1e-6, 1e-9);
    RunContext inf_ref = context(inf_log, false), inf_par = context(inf_log, true);
    forward(inf_ref, f, with_inf, w);
    Tensor near = with_inf.clone();
    near.set(11, std::nextafter(1.0625f, 2.0f));
    forward(inf_par, f, near, w);
    CHECK(inf_log.taken() == 0);
}

TEST_CASE("a tensor-parallel piece of a float8 operand is looked up at its own columns", "[cpu]") {
    // the reference's whole input [4, 16]; tp rank 1 of 2 holds columns 8..15 (a rowwise style's
    // Shard(-1)) and its weight's columns likewise
    Float8Gemms whole;
    whole.fqn = "o_proj";
    Tensor x({4, 16}, DType::float32), w({2, 16}, DType::float32);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.25 * static_cast<double>(i % 5) - 0.5);
    for (int64_t i = 0; i < w.numel(); ++i) w.set(i, 0.125 * static_cast<double>(1 + i % 3));
    x.set(8, 448.0);            // the scale 1, the whole's and rank 1's piece's
    x.set(2 * 16 + 9, 1.0625);  // a tie in rank 1's piece: its column 1
    Float8Log log(1e-6, 1e-9);
    RunContext ref = context(log, false);
    forward(ref, whole, x, w);

    Float8Gemms piece = whole;
    piece.tp.input.cols = piece.tp.weight.cols = true;
    RunContext par = context(log, true);
    par.tp_rank = 1, par.tp_parts = 2;  // no tp group: each piece its own amax, the same here
    const Tensor x1 = x.narrow(1, 8, 8).clone(), w1 = w.narrow(1, 8, 8).clone();
    Tensor nudged = x1.clone();
    nudged.set(2 * 8 + 1, std::nextafter(1.0625f, 2.0f));
    Float8Log none(1e-6, 1e-9);
    RunContext alone = context(none, true);
    const Tensor own = forward(alone, piece, nudged, w1), want = forward(alone, piece, x1, w1);
    CHECK_FALSE(same_bits(own, want));
    CHECK(same_bits(forward(par, piece, nudged, w1), want));
    CHECK(log.taken() == 1);
    // rank 0's columns are other values: nothing of rank 1's piece agrees with them
    log.reset_taken();
    par.tp_rank = 0;
    CHECK(same_bits(forward(par, piece, nudged, w1), own));
    CHECK(log.taken() == 0);
}

TEST_CASE("a float8 log travels as words with its tolerance, values and amaxes bit for bit", "[cpu]") {
    Float8Log log(1.25e-6, 3e-9);
    Float8Logged v;
    v.first_row = 4, v.seq = 2, v.rows = 1, v.cols = 2;
    v.values = {1.0625f, -0.0f, std::nextafter(3.0f, 4.0f), 1e-30f};
    v.measure();
    log.record(1, 2, "layers.0.q_proj", Float8Role::grad_output, v);
    Float8Log back(0, 0);
    back.read_words(log.words());
    CHECK(back.rtol() == 1.25e-6);
    CHECK(back.atol() == 3e-9);
    const Float8Logged* got = back.find(1, 2, "layers.0.q_proj", Float8Role::grad_output);
    REQUIRE(got);
    CHECK((got->first_row == 4 && got->seq == 2 && got->rows == 1 && got->cols == 2));
    REQUIRE(got->values.size() == 4);
    for (size_t i = 0; i < 4; ++i) CHECK(std::signbit(got->values[i]) == std::signbit(v.values[i]));
    CHECK(got->values == v.values);
    CHECK(got->row_amax == std::vector<float>{1.0625f, std::nextafter(3.0f, 4.0f)});
    CHECK(got->col_amax == std::vector<float>{std::nextafter(3.0f, 4.0f), 1e-30f});
    CHECK_FALSE(back.find(1, 2, "layers.0.q_proj", Float8Role::input));
}

}  // namespace test_float8_log
