// Float8 linears (model/float8_linear.h) and the plan's float8 section (parallel/float8_training.h):
// the GEMMs are torchao's tensorwise casts and scaled products, bit for bit; the reference's row
// groups compute what each data rank computes alone; the selection is torchtitan's (dims of 16,
// filter_fqns by substring, the head left out by default); bad sections are exit 2 at their key.
#include <cmath>

#include "core/rng.h"
#include "model/float8_gemm.h"
#include "model/float8_linear.h"
#include "model/model.h"
#include "parallel/parallelize.h"
#include "parallel/plan.h"
#include "test_helpers.h"
#include "train/run.h"

using namespace ptool;

namespace test_float8_linear {

namespace {

Tensor random(const Shape& s, uint64_t seed, double scale) {
    CounterRng rng(seed, 3);
    Tensor t(s, DType::float32);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, scale * (2 * rng.uniform(static_cast<uint64_t>(i)) - 1));
    return t;
}

RunContext cpu_context(int row_groups) {
    RunContext ctx;
    ctx.backend = &backend_for(Device::cpu);
    ctx.float8_row_groups = row_groups;
    return ctx;
}

// torchao's tensorwise GEMM of two whole host tensors, from model/float8_gemm.h's pieces
Tensor emulated(const Tensor& a, Float8Format fa, bool ta, const Tensor& b, Float8Format fb, bool tb,
                Shape out) {
    Tensor y(std::move(out), DType::float32);
    float8_gemm(backend_for(Device::cpu), float8_tensorwise(a, fa, float8_amax(a)), ta,
                float8_tensorwise(b, fb, float8_amax(b)), tb, y);
    return y;
}

}  // namespace

TEST_CASE("a float8 linear's three GEMMs are torchao's tensorwise casts and scaled products", "[cpu]") {
    const Tensor x = random({12, 32}, 1, 3.0), w = random({16, 32}, 2, 0.2), dy = random({12, 16}, 3, 1e-3);
    const Float8Gemms f;
    RunContext ctx = cpu_context(1);
    Tensor y({12, 16}, DType::float32);
    float8_forward(ctx, f, x, w, y);
    CHECK(same_bits(y, emulated(x, Float8Format::e4m3fn, false, w, Float8Format::e4m3fn, true, {12, 16})));
    const Float8BackwardAmax a = float8_backward_amax(ctx, f, dy, x, w);
    CHECK(a.grad_output == std::vector<double>{float8_amax(dy)});
    Tensor dx({12, 32}, DType::float32), dw({16, 32}, DType::float32);
    float8_input_grad(ctx, f, a, dy, w, dx);
    CHECK(same_bits(dx, emulated(dy, Float8Format::e5m2, false, w, Float8Format::e4m3fn, false, {12, 32})));
    float8_weight_grad(ctx, f, a, dy, x, dw);
    CHECK(same_bits(dw, emulated(dy, Float8Format::e5m2, true, x, Float8Format::e4m3fn, false, {16, 32})));
    // the gradient's format is the recipe's: e4m3fn there is another number
    Float8Gemms e4 = f;
    e4.recipe.grad_output = Float8Format::e4m3fn;
    Tensor dx4({12, 32}, DType::float32);
    float8_input_grad(ctx, e4, a, dy, w, dx4);
    CHECK_FALSE(same_bits(dx4, dx));
    // the product differs from the float32 GEMM by the casts, within their unit roundoffs
    Tensor exact({12, 16}, DType::float32);
    backend_for(Device::cpu).gemm(x, false, w, true, exact);
    CHECK_FALSE(same_bits(exact, y));
}

TEST_CASE("the reference's row groups compute what each data rank computes with its own rows", "[cpu]") {
    // two data ranks' rows, one a hundred times the other's scale: one scale for both would lose
    // the small rank's precision
    Tensor x = random({8, 32}, 4, 1.0), dy = random({8, 16}, 5, 1.0);
    const Tensor w = random({16, 32}, 6, 0.2);
    for (int64_t i = 4 * 32; i < 8 * 32; ++i) x.set(i, x.item(i) * 100);
    for (int64_t i = 4 * 16; i < 8 * 16; ++i) dy.set(i, dy.item(i) * 100);
    const Float8Gemms f;
    RunContext both = cpu_context(2), one = cpu_context(1);
    Tensor y({8, 16}, DType::float32), dw({16, 32}, DType::float32), whole({8, 16}, DType::float32);
    float8_forward(both, f, x, w, y);
    float8_forward(one, f, x, w, whole);
    CHECK_FALSE(same_bits(y, whole));
    Tensor dw_ranks({16, 32}, DType::float32);
    for (int r = 0; r < 2; ++r) {  // each rank alone: its rows, its scales
        const Tensor xr = x.narrow(0, 4 * r, 4).clone(), dyr = dy.narrow(0, 4 * r, 4).clone();
        Tensor yr({4, 16}, DType::float32);
        float8_forward(one, f, xr, w, yr);
        CHECK(same_bits(yr, y.narrow(0, 4 * r, 4).clone()));
        float8_weight_grad(one, f, float8_backward_amax(one, f, dyr, xr, w), dyr, xr, dw_ranks);
    }
    float8_weight_grad(both, f, float8_backward_amax(both, f, dy, x, w), dy, x, dw);
    CHECK(same_bits(dw, dw_ranks));  // the ranks' gradients added in rank order
}

TEST_CASE("float8 converts torchtitan's linears: dims of 16, filter_fqns by substring, not the head",
          "[cpu]") {
    auto converted = [&](const std::string& section) {
        Model copy =
            load_model_text(read_text(PTOOL_SOURCE_DIR "/models/llama_rope.yaml"), "models/llama_rope.yaml");
        const Plan p = load_plan_text("mesh: {dp: 1}\n" + section, "p.yaml");
        return apply_float8(copy, *p.float8, resolve_plan(copy, p));
    };
    const auto all = converted("float8: {recipe: tensorwise}\n");
    CHECK(all.size() == 14);  // 2 blocks x (q, k, v, o, gate, up, down); the output head left out
    CHECK(std::find(all.begin(), all.end(), "output") == all.end());
    const auto listed = converted("float8: {recipe: tensorwise, filter_fqns: [attention, down]}\n");
    CHECK(listed == std::vector<std::string>{"layers.0.ffn_block.feed_forward.gate_proj",
                                             "layers.0.ffn_block.feed_forward.up_proj",
                                             "layers.1.ffn_block.feed_forward.gate_proj",
                                             "layers.1.ffn_block.feed_forward.up_proj", "output"});
    CHECK(std::find(listed.begin(), listed.end(), "output") != listed.end());  // named filters only
    require_input_error([&] { converted("float8: {recipe: tensorwise, filter_fqns: [layers, output]}\n"); },
                        {"p.yaml:2:9", "no linear of the model is converted"});
    // a linear of 8 features is left as it is (float8 tensor cores take multiples of 16)
    const std::string small =
        "name: s\nbatch: {input: [4, 32]}\nmodules:\n"
        "  - {name: a, type: linear, in: 32, out: 8}\n"
        "  - {name: b, type: linear, in: 8, out: 32}\n"
        "  - {name: c, type: linear, in: 32, out: 32}\nloss: mean\n";
    Model s = load_model_text(small, "s.yaml");
    const Plan p = load_plan_text("mesh: {dp: 1}\nfloat8: {recipe: tensorwise, filter_fqns: []}\n", "p.yaml");
    CHECK(apply_float8(s, *p.float8, resolve_plan(s, p)) == std::vector<std::string>{"c"});
}

TEST_CASE("a bad float8 section is exit 2 at its key", "[cpu]") {
    CHECK_THAT(
        plan_error("mesh: {dp: 1}\nfloat8: {recipe: tensorwize}\n"),
        Catch::Contains("p.yaml:2:18: unknown float8 recipe 'tensorwize' (did you mean 'tensorwise'?)"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {recipe: rowwise}\n"),
               Catch::Contains("p.yaml:2:18: float8 recipe 'rowwise': ptool runs tensorwise only so far"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {recipe: tensorwise, filter_fqns: ['']}\n"),
               Catch::Contains("an empty filter_fqns entry"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {}\n"), Catch::Contains("p.yaml:2:9"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {recipe: tensorwise, emulate: true}\n"),
               Catch::Contains("emulate"));
    // the reference scales each data rank's rows apart
    const Plan p = load_plan_text(
        "mesh: {dp: 2, tp: 2}\ndata_parallel: {mesh_dim: dp}\nfloat8: {recipe: tensorwise}\n", "p.yaml");
    CHECK(p.float8->row_groups == 1);
    CHECK(reference_plan(p).float8->row_groups == 2);
}

}  // namespace test_float8_linear
