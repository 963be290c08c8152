// Float8 linears (model/float8_linear.h) and the plan's float8 section (parallel/float8_training.h):
// the GEMMs are torchao's tensorwise casts and scaled products, bit for bit; the reference's row
// groups compute what each data rank computes alone; the selection is torchtitan's (dims of 16,
// filter_fqns by substring, the head left out by default); bad sections are exit 2 at their key.
#include <array>
#include <cmath>
#include <string>

#include "backend/meta/meta_backend.h"
#include "comm/comm_threads.h"
#include "core/device_memory.h"
#include "core/rng.h"
#include "model/float8_cost.h"
#include "model/float8_gemm.h"
#include "model/float8_linear.h"
#include "model/model.h"
#include "parallel/parallelize.h"
#include "parallel/plan.h"
#include "plan/kernel_table.h"
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
    ctx.float8_row_groups.data = row_groups;
    return ctx;
}

// The plan's float8 linears swapped into m, as Run::Run does: their fqns.
std::vector<std::string> convert(Model& m, const Plan& p) {
    const Resolution r = resolve_plan(m, p);
    apply_float8(m, r);
    return float8_linears(r);
}

// sum += part, on the host
void be_sum(Tensor& sum, const Tensor& part) {
    backend_for(Device::cpu).axpy(1.0, part, sum);
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
    const Parameter wp{w, {}};
    RunContext ctx = cpu_context(1);
    Tensor y({12, 16}, DType::float32);
    float8_forward(ctx, f, x, wp, y);
    CHECK(same_bits(y, emulated(x, Float8Format::e4m3fn, false, w, Float8Format::e4m3fn, true, {12, 16})));
    const Float8BackwardAmax a = float8_backward_amax(ctx, f, dy, x, wp);
    CHECK(a.grad_output == std::vector<double>{float8_amax(dy)});
    Tensor dx({12, 32}, DType::float32), dw({16, 32}, DType::float32);
    float8_input_grad(ctx, f, a, dy, wp, dx);
    CHECK(same_bits(dx, emulated(dy, Float8Format::e5m2, false, w, Float8Format::e4m3fn, false, {12, 32})));
    float8_weight_grad(ctx, f, a, dy, x, dw);
    CHECK(same_bits(dw, emulated(dy, Float8Format::e5m2, true, x, Float8Format::e4m3fn, false, {16, 32})));
    // the gradient's format is the recipe's: e4m3fn there is another number
    Float8Gemms e4 = f;
    e4.recipe.grad_output = Float8Format::e4m3fn;
    Tensor dx4({12, 32}, DType::float32);
    float8_input_grad(ctx, e4, a, dy, wp, dx4);
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
    const Parameter w{random({16, 32}, 6, 0.2), {}};
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
        return convert(copy, p);
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
    CHECK(convert(s, p) == std::vector<std::string>{"c"});
}

TEST_CASE("a bad float8 section is exit 2 at its key", "[cpu]") {
    CHECK_THAT(
        plan_error("mesh: {dp: 1}\nfloat8: {recipe: tensorwize}\n"),
        Catch::Contains("p.yaml:2:18: unknown float8 recipe 'tensorwize' (did you mean 'tensorwise'?)"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {recipe: rowwise_gw_hp}\n"),
               Catch::Contains("p.yaml:2:18: unknown float8 recipe 'rowwise_gw_hp' (valid: tensorwise, "
                               "rowwise, rowwise_with_gw_hp)"));
    CHECK_THAT(
        plan_error("mesh: {dp: 1}\nfloat8: {recipe: rowwise_with_gw_hp, enable_fsdp_float8_all_gather: "
                   "true}\n"),
        Catch::Contains("torchao's float8 all-gather takes recipe tensorwise, not rowwise_with_gw_hp"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {recipe: rowwise, enable_fsdp_float8_all_gather: true}\n"),
               Catch::Contains("p.yaml:2:58: enable_fsdp_float8_all_gather casts a weight with one scale"));
    CHECK_THAT(
        plan_error("mesh: {dp: 1}\nfloat8: {recipe: tensorwise, precompute_float8_dynamic_scale_for_fsdp: "
                   "true}\n"),
        Catch::Contains("p.yaml:2:72: precompute_float8_dynamic_scale_for_fsdp precomputes"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {recipe: tensorwise, filter_fqns: ['']}\n"),
               Catch::Contains("an empty filter_fqns entry"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {}\n"), Catch::Contains("p.yaml:2:9"));
    CHECK_THAT(plan_error("mesh: {dp: 1}\nfloat8: {recipe: tensorwise, emulate: true}\n"),
               Catch::Contains("emulate"));
    // the reference scales each data rank's rows apart
    const Plan p = load_plan_text(
        "mesh: {dp: 2, tp: 2}\ndata_parallel: {mesh_dim: dp}\nfloat8: {recipe: tensorwise}\n", "p.yaml");
    CHECK(p.float8->row_groups.groups() == 1);
    CHECK(reference_plan(p).float8->row_groups.groups() == 2);
    // and under context parallelism each cp rank's positions
    const Plan cp = load_plan_text(
        "mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp}\ncontext_parallel: "
        "{mesh_dim: cp}\nfloat8: {recipe: tensorwise}\n",
        "p.yaml");
    const Float8RowGroups g = reference_plan(cp).float8->row_groups;
    CHECK((g.data == 2 && g.cp == 2 && g.load_balance && g.groups() == 4));
    // rowwise under tensor parallelism converts both, each knowing which of its dims tp cuts
    Model m = load_model_text(
        "name: s\nbatch: {input: [2, 8, 16], target: [2, 8, 16]}\nmodules:\n"
        "  - {name: a, type: linear, in: 16, out: 32}\n"
        "  - {name: b, type: linear, in: 32, out: 16}\nloss: mse\n",
        "s.yaml");
    const Plan tp = load_plan_text(
        "mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan: {a: colwise, b: rowwise}\n"
        "float8: {recipe: rowwise, filter_fqns: []}\n",
        "p.yaml");
    CHECK(convert(m, tp) == std::vector<std::string>{"a", "b"});
    const Float8TpPieces a = m.root->children()[0].second->float8()->tp,
                         b = m.root->children()[1].second->float8()->tp;
    CHECK((a.weight.rows && !a.weight.cols && !a.input.any() && a.grad_output.cols && !a.grad_output.rows));
    CHECK((b.weight.cols && !b.weight.rows && b.input.cols && !b.input.rows && !b.grad_output.any()));
}

}  // namespace test_float8_linear

namespace test_float8_linear {

TEST_CASE("a float8 GEMM is priced at the kernel table's float8 rows where it has them", "[cpu]") {
    const KernelTable h200 = load_kernel_table(PTOOL_SOURCE_DIR "/clusters/kernels/h200_sxm_141gb.json");
    const KernelTable h100 = load_kernel_table(PTOOL_SOURCE_DIR "/clusters/kernels/h100_sxm5_80gb.json");
    REQUIRE(h200.has_float8_gemm(DType::bfloat16));
    REQUIRE(h100.has_float8_gemm(DType::bfloat16));  // derived from the H200's (docs/kernel_table.md)
    CHECK(h200.has_gemm(DType::bfloat16));
    // a measured shape (bench/validation/h200/h200_float8.jsonl: m 1024, n 2048, k 8192) is its row
    GemmKey q{GemmOp::fwd, DType::bfloat16, 1024, 2048, 8192};
    q.float8 = true;
    CHECK(h200.gemm_seconds(q) == Approx(2.696000039577484e-05).epsilon(1e-9));
    GemmKey plain = q;
    plain.float8 = false;
    CHECK(h200.gemm_seconds(plain) > 1.5 * h200.gemm_seconds(q));  // bf16: 4.57e-5 s measured beside it
    // the H100's derived row: its bf16 row x the H200's float8 / bf16 of the same shape and op
    CHECK(h100.gemm_seconds(q) ==
          Approx(h100.gemm_seconds(plain) * 2.696000039577484e-05 / h200.gemm_seconds(plain)).epsilon(1e-9));
    // a table without float8 rows prices it as its output dtype's GEMM
    const KernelTable plain_only = load_kernel_table_text(  // (a peak its row does not beat: 343 TFLOP/s)
        R"({"format": "ptool kernel table 1", "gpu": "g", "peak": {"tflops": {"bfloat16": 1000}, "memory_bandwidth_gb_s": 1},
  "gemm": [{"dtype": "bfloat16", "op": "fwd", "m": 1024, "n": 2048, "k": 8192, "seconds": 1e-4}],
  "memory": [{"op": "copy", "dtype": "bfloat16", "elements": 1, "bytes": 4, "seconds": 1}]})",
        "k.json");
    CHECK_FALSE(plain_only.has_float8_gemm(DType::bfloat16));
    CHECK(plain_only.gemm_seconds(q) == plain_only.gemm_seconds(plain));
    // a float8 linear's GEMMs counted on meta tensors as float8 GEMMs writing the compute dtype
    MetaAllocation meta;
    meta_work() = MetaWork{};
    RunContext ctx;
    ctx.backend = &backend_for(Device::meta);
    const Tensor x = Tensor::empty({64, 32}, DType::bfloat16, Device::meta),
                 w = Tensor::empty({16, 32}, DType::bfloat16, Device::meta);
    Tensor y = Tensor::empty({64, 16}, DType::bfloat16, Device::meta);
    const Parameter wp{w, {}};
    float8_forward(ctx, Float8Gemms{}, x, wp, y);
    REQUIRE(meta_work().gemms.size() == 1);
    const GemmKey counted = meta_work().gemms.begin()->first;
    CHECK((counted.float8 && counted.dtype == DType::bfloat16 && counted.op == GemmOp::fwd &&
           counted.m == 64 && counted.n == 16 && counted.k == 32));
}

TEST_CASE("a kernel table's float8 rows say their recipe, tensorwise", "[cpu]") {
    const std::string table =
        R"({"format": "ptool kernel table 1", "gpu": "g", "peak": {"tflops": {"bfloat16": 1}, "memory_bandwidth_gb_s": 1},
  "gemm": [{"dtype": "bfloat16", "op": "fwd", "m": 1, "n": 1, "k": 1, "seconds": 1},
           {"dtype": "bfloat16", "float8": "rowwise", "op": "fwd", "m": 1, "n": 1, "k": 1, "seconds": 1}],
  "memory": [{"op": "copy", "dtype": "bfloat16", "elements": 1, "bytes": 4, "seconds": 1}]})";
    require_input_error([&] { load_kernel_table_text(table, "k.json"); },
                        {"k.json:3:", "'float8' of a 'gemm' row must be tensorwise, got 'rowwise'"});
}

}  // namespace test_float8_linear

namespace test_float8_linear {

TEST_CASE("a float8 linear reduces over tp the pieces its own GEMMs see", "[cpu]") {
    Model m =
        load_model_text(read_text(PTOOL_SOURCE_DIR "/models/llama_rope.yaml"), "models/llama_rope.yaml");
    const Plan p = load_plan(PTOOL_SOURCE_DIR "/tests/data/float8/llama_rope_fsdp_tp_float8.yaml");
    convert(m, p);
    auto pieces = [&](const std::string& fqn) {
        for (const auto& [name, mod] : named_modules(*m.root))
            if (name == fqn) return mod->float8()->tp;
        FAIL("no module " << fqn);
        return Float8TpPieces{};
    };
    // colwise (its input gathered from the sequence shards first): the weight's rows, the output
    // gradient's Shard(-1); rowwise: the weight's columns and its Shard(-1) input, a Partial output
    // whose gradient is whole
    for (const char* col :
         {"layers.0.attn_block.attention.q_proj", "layers.1.ffn_block.feed_forward.up_proj"}) {
        const Float8TpPieces c = pieces(col);
        CHECK((c.weight.rows && !c.weight.cols && !c.input.any()));
        CHECK((!c.grad_output.rows && c.grad_output.cols));
    }
    for (const char* row :
         {"layers.0.attn_block.attention.o_proj", "layers.1.ffn_block.feed_forward.down_proj"}) {
        const Float8TpPieces r = pieces(row);
        CHECK((!r.weight.rows && r.weight.cols && !r.input.rows && r.input.cols && !r.grad_output.any()));
    }
    // an unstyled linear on sequence-parallel Shard(1) activations: its input and output gradient
    const std::string seq =
        "name: s\nbatch: {input: [2, 8, 16], target: [2, 8, 16]}\nmodules:\n"
        "  - {name: norm, type: rms_norm, dim: 16}\n"
        "  - {name: head, type: linear, in: 16, out: 16}\nloss: mse\n";
    Model s = load_model_text(seq, "s.yaml");
    const Plan sp = load_plan_text(
        "mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan: {norm: sequence_parallel}\n"
        "float8: {recipe: tensorwise, filter_fqns: []}\n",
        "p.yaml");
    convert(s, sp);
    const Float8TpPieces h = s.root->children().back().second->float8()->tp;
    CHECK((!h.weight.any() && h.input.rows && !h.input.cols && h.grad_output.rows && !h.grad_output.cols));
}

TEST_CASE("a weight gathered as float8 codes computes what its cast computes", "[cpu]") {
    // FSDP2's float8 all-gather hands the linear the codes and the scale the shards were cast with
    const Tensor x = random({12, 32}, 11, 2.0), w = random({16, 32}, 12, 0.3), dy = random({12, 16}, 13, 1.0);
    const Parameter high{w, {}};
    const float scale = float8_tensorwise_scale(float8_amax(w), Float8Format::e4m3fn);
    Tensor codes({16, 32}, DType::uint8);
    float8_cast_codes(w, Float8Format::e4m3fn, scale, codes);
    const Parameter cast{codes, {}, scale};
    const Float8Gemms f;
    RunContext ctx = cpu_context(1);
    Tensor y_high({12, 16}, DType::float32), y_cast({12, 16}, DType::float32);
    float8_forward(ctx, f, x, high, y_high);
    float8_forward(ctx, f, x, cast, y_cast);
    CHECK(same_bits(y_high, y_cast));
    Tensor dx_high({12, 32}, DType::float32), dx_cast({12, 32}, DType::float32);
    float8_input_grad(ctx, f, float8_backward_amax(ctx, f, dy, x, high), dy, high, dx_high);
    float8_input_grad(ctx, f, float8_backward_amax(ctx, f, dy, x, cast), dy, cast, dx_cast);
    CHECK(same_bits(dx_high, dx_cast));
    // another scale is other codes: the scale travels with them
    const Parameter halved{codes, {}, scale / 2};
    float8_forward(ctx, f, x, halved, y_cast);
    CHECK_FALSE(same_bits(y_high, y_cast));
}

TEST_CASE("Tensor::view reads the same bytes as another dtype", "[cpu]") {
    const Tensor t = Tensor::from_doubles({4}, DType::float32, {1.0, -2.0, 0.5, 3.0});
    const Tensor bytes = t.view(DType::uint8);
    CHECK((bytes.shape() == Shape{16} && bytes.shares_storage(t)));
    CHECK(bytes.item(3) == 0x3f);  // 1.0f little-endian: 00 00 80 3f
    CHECK(bytes.narrow(0, 8, 4).view(DType::float32).item(0) == 0.5);
    CHECK_THROWS(bytes.narrow(0, 2, 4).view(DType::float32));  // not on an element boundary
}

TEST_CASE("the reference scales each cp rank's positions apart, as the ranks scale their local tensors",
          "[cpu]") {
    // two sequences of 8 positions on cp 2, load-balanced: rank 0 holds positions 0-1 and 6-7,
    // rank 1 positions 2-5; each rank's positions a different magnitude
    Tensor x = random({16, 32}, 21, 1.0), dy = random({16, 16}, 22, 1.0);
    for (int64_t row = 0; row < 16; ++row)
        if (const int64_t pos = row % 8; pos >= 2 && pos < 6)
            for (int64_t k = 0; k < 32; ++k) x.set(row * 32 + k, 50 * x.item(row * 32 + k));
    const Parameter w{random({16, 32}, 23, 0.2), {}};
    const Float8Gemms f;
    RunContext ref = cpu_context(1), rank = cpu_context(1);
    ref.float8_row_groups = {1, 2, true};
    Tensor y({16, 16}, DType::float32), dw({16, 32}, DType::float32);
    float8_forward(ref, f, x, w, y, 8);
    const Float8BackwardAmax a = float8_backward_amax(ref, f, dy, x, w, 8);
    float8_weight_grad(ref, f, a, dy, x, dw);
    const std::vector<std::vector<int64_t>> positions = {{0, 1, 6, 7}, {2, 3, 4, 5}};
    Tensor dw_ranks({16, 32}, DType::float32), y_whole({16, 16}, DType::float32);
    for (const auto& mine : positions) {  // each rank alone on its local tensor, as torchtitan's cp runs it
        std::vector<int64_t> rows;
        for (int64_t seq = 0; seq < 2; ++seq)
            for (int64_t p : mine) rows.push_back(seq * 8 + p);
        Tensor xr({8, 32}, DType::float32), dyr({8, 16}, DType::float32), yr({8, 16}, DType::float32);
        for (size_t i = 0; i < rows.size(); ++i) {
            for (int64_t k = 0; k < 32; ++k)
                xr.set(static_cast<int64_t>(i) * 32 + k, x.item(rows[i] * 32 + k));
            for (int64_t k = 0; k < 16; ++k)
                dyr.set(static_cast<int64_t>(i) * 16 + k, dy.item(rows[i] * 16 + k));
        }
        float8_forward(rank, f, xr, w, yr, 4);
        for (size_t i = 0; i < rows.size(); ++i)
            for (int64_t k = 0; k < 16; ++k)
                CHECK(yr.item(static_cast<int64_t>(i) * 16 + k) == y.item(rows[i] * 16 + k));
        float8_weight_grad(rank, f, float8_backward_amax(rank, f, dyr, xr, w, 4), dyr, xr, dw_ranks);
    }
    CHECK(same_bits(dw, dw_ranks));
    float8_forward(rank, f, x, w, y_whole, 8);  // one scale over both ranks' positions: other numbers
    CHECK_FALSE(same_bits(y, y_whole));
}

TEST_CASE("the rowwise recipe scales each row or column along its GEMM's reduction dim by a power of 2",
          "[cpu]") {
    CHECK(float8_power_of_2(448.0f / 3.0f) == 128.0f);
    CHECK(float8_power_of_2(256.0f) == 256.0f);
    CHECK(float8_power_of_2(0.75f) == 0.5f);
    Float8Recipe r;
    REQUIRE(float8_recipe_named("rowwise", &r));
    CHECK((r.scaling == Float8Scaling::rowwise && r.grad_output == Float8Format::e4m3fn));
    CHECK_FALSE(float8_recipe_named("rowwise_gw_hp", &r));
    // rows of very different magnitudes: each keeps its own precision
    Tensor x = random({8, 32}, 31, 1.0), dy = random({8, 16}, 32, 1.0);
    for (int64_t i = 0; i < 8 * 32; ++i) x.set(i, x.item(i) * std::pow(4.0, static_cast<double>(i / 32)));
    const Parameter w{random({16, 32}, 33, 0.2), {}};
    Float8Gemms f;
    f.recipe = r;
    RunContext ctx = cpu_context(1);
    Tensor y({8, 16}, DType::float32), dx({8, 32}, DType::float32), dw({16, 32}, DType::float32);
    float8_forward(ctx, f, x, w, y);
    const Float8BackwardAmax a = float8_backward_amax(ctx, f, dy, x, w);
    float8_input_grad(ctx, f, a, dy, w, dx);
    float8_weight_grad(ctx, f, a, dy, x, dw);
    // each product is the float32 GEMM of the operands' float8 values over their power-of-2 scales
    // (exact), up to the accumulation's rounding: a scale on the wrong axis is far off
    auto dequantised = [](const Tensor& t, int axis) {
        const Float8Operand o =
            float8_axiswise(t, Float8Format::e4m3fn, float8_amax_axis(t, axis), axis, true);
        Tensor out(t.shape(), DType::float32);
        for (int64_t i = 0; i < t.numel(); ++i)
            out.set(i, o.values.item(i) / o.scales[axis == 0 ? i / t.size(1) : i % t.size(1)]);
        return out;
    };
    auto near = [](const Tensor& got, const Tensor& want) {  // row by row, each against its own magnitude
        const int64_t cols = got.size(1);
        for (int64_t r = 0; r < got.size(0); ++r) {
            double worst = 0, scale = 0;
            for (int64_t c = 0; c < cols; ++c) {
                const int64_t i = r * cols + c;
                worst = std::max(worst, std::fabs(got.item(i) - want.item(i)));
                scale = std::max(scale, std::fabs(want.item(i)));
            }
            if (worst > 1e-6 * scale) return false;
        }
        return true;
    };
    Backend& be = backend_for(Device::cpu);
    Tensor want_y({8, 16}, DType::float32), want_dx({8, 32}, DType::float32),
        want_dw({16, 32}, DType::float32);
    be.gemm(dequantised(x, 0), false, dequantised(w.value, 0), true, want_y);
    be.gemm(dequantised(dy, 0), false, dequantised(w.value, 1), false, want_dx);
    be.gemm(dequantised(dy, 1), true, dequantised(x, 1), false, want_dw);
    CHECK(near(y, want_y));
    CHECK(near(dx, want_dx));
    CHECK(near(dw, want_dw));
    // a row's output needs no other row: the first half alone gives its rows bitwise
    Tensor half({4, 16}, DType::float32);
    float8_forward(ctx, f, x.narrow(0, 0, 4).clone(), w, half);
    CHECK(same_bits(half, y.narrow(0, 0, 4).clone()));
    // the tensorwise recipe loses the small rows' precision
    Tensor tensorwise({8, 16}, DType::float32);
    float8_forward(ctx, Float8Gemms{}, x, w, tensorwise);
    CHECK_FALSE(near(tensorwise, want_y));
}

TEST_CASE(
    "rowwise_with_gw_hp: rowwise's forward, one power-of-2 weight scale in the input gradient, the "
    "weight gradient in high precision",
    "[cpu]") {
    Float8Recipe r;
    REQUIRE(float8_recipe_named("rowwise_with_gw_hp", &r));
    CHECK(std::string(float8_recipe_name(r)) == "rowwise_with_gw_hp");
    Float8Recipe rowwise;
    REQUIRE(float8_recipe_named("rowwise", &rowwise));
    // the weight's columns 1e3 apart: one scale for the whole weight loses the small columns' precision,
    // where the rowwise recipe's per-column scales keep it
    Tensor x = random({8, 32}, 51, 1.0), dy = random({8, 16}, 52, 1.0), wv = random({16, 32}, 53, 0.2);
    for (int64_t i = 0; i < 16 * 32; ++i)
        if (i % 32 < 8) wv.set(i, wv.item(i) * 1e-3);
    const Parameter w{wv, {}};
    RunContext ctx = cpu_context(1);
    auto run = [&](const Float8Recipe& recipe) {  // {y, dx, dw}
        Float8Gemms f;
        f.recipe = recipe;
        Tensor y({8, 16}, DType::float32), dx({8, 32}, DType::float32),
            dw = Tensor::zeros({16, 32}, DType::float32);
        float8_forward(ctx, f, x, w, y);
        const Float8BackwardAmax a = float8_backward_amax(ctx, f, dy, x, w);
        float8_input_grad(ctx, f, a, dy, w, dx);
        float8_weight_grad(ctx, f, a, dy, x, dw);
        return std::array<Tensor, 3>{y, dx, dw};
    };
    const auto [y, dx, dw] = run(r);
    const auto [ry, rdx, rdw] = run(rowwise);
    CHECK(same_bits(y, ry));  // the forward is rowwise's
    Backend& be = backend_for(Device::cpu);
    // the input gradient: dy's e4m3fn rows over their power-of-2 scales times W's e4m3fn values over
    // one power-of-2 scale (torchao repeats it along the columns for _scaled_mm), exactly as
    // float8_gemm computes it
    const Float8Operand d = float8_axiswise(dy, Float8Format::e4m3fn, float8_amax_axis(dy, 0), 0, true);
    const Float8Operand wt = float8_tensorwise(wv, Float8Format::e4m3fn, float8_amax(wv), true);
    CHECK(wt.scale == float8_power_of_2(float8_tensorwise_scale(float8_amax(wv), Float8Format::e4m3fn)));
    CHECK(wt.scale != float8_tensorwise_scale(float8_amax(wv), Float8Format::e4m3fn));  // (rounded down)
    Tensor want_dx({8, 32}, DType::float32);
    float8_gemm(be, d, false, wt, false, want_dx);
    CHECK(same_bits(dx, want_dx));
    CHECK_FALSE(same_bits(dx, rdx));
    // the weight gradient: the plain linear's GEMM, bitwise
    Tensor want_dw = Tensor::zeros({16, 32}, DType::float32);
    be.gemm(dy, true, x, false, want_dw, 1.0, 1.0);
    CHECK(same_bits(dw, want_dw));
    CHECK_FALSE(same_bits(dw, rdw));
    // under tp (a colwise linear: W's rows and dy's columns cut) W's one scale is the whole weight's,
    // its amax reduced over tp: rank 1's rows 1e5 times rank 0's, so that the whole weight's scale
    // puts rank 0's among e4m3fn's subnormals where their own amax would not
    Tensor wb = wv.clone();
    for (int64_t i = 8 * 32; i < 16 * 32; ++i) wb.set(i, wb.item(i) * 1e5);
    Float8Gemms f;
    f.recipe = r;
    Tensor want_tp({8, 32}, DType::float32);
    float8_input_grad(ctx, f, float8_backward_amax(ctx, f, dy, x, Parameter{wb, {}}), dy, Parameter{wb, {}},
                      want_tp);
    auto on_tp2 = [&](bool reduce) {  // the ranks' partial input gradients summed
        Float8Gemms col = f;
        col.recipe.reduce_amax = reduce;
        col.tp.grad_output.cols = col.tp.weight.rows = true;
        std::vector<Tensor> dxs(2);
        run_rank_threads(2, CommOptions{}, [&](Communicator& tp) {
            const int k = tp.rank();
            RunContext c = cpu_context(1);
            c.tp = &tp;
            const Tensor dyr = dy.narrow(1, 8 * k, 8).clone();
            const Parameter wr{wb.narrow(0, 8 * k, 8).clone(), {}};
            Tensor part({8, 32}, DType::float32);
            float8_input_grad(c, col, float8_backward_amax(c, col, dyr, x, wr), dyr, wr, part);
            dxs[k] = part;
        });
        be.axpy(1.0, dxs[1], dxs[0]);
        return dxs[0];
    };
    auto close = [](const Tensor& got, const Tensor& want) {  // within float32 accumulation of the whole
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < want.numel(); ++i)
            worst = std::max(worst, std::fabs(got.item(i) - want.item(i))),
            scale = std::max(scale, std::fabs(want.item(i)));
        return scale > 0 && worst <= 1e-6 * scale;
    };
    CHECK(close(on_tp2(true), want_tp));
    CHECK_FALSE(close(on_tp2(false), want_tp));
}

TEST_CASE("a rowwise scale along a reduction dim tp cuts covers the whole row, its amax reduced over tp",
          "[cpu]") {
    // x [4, 32] and w [16, 32] of a rowwise-parallel linear (their columns cut over tp 2) and dy
    // [4, 16] and w of a colwise one (dy's columns, w's rows): rows 0 and 1 of x and dy hold 2e-5
    // times the rest in tp rank 1's half, w's rows 1e5 times the rest there. Scaled over the whole
    // row, the small halves fall among e4m3fn's subnormals; scaled by a half alone they keep their
    // precision: the ranks' GEMMs summed must be the one-device GEMM's, row by row.
    Tensor x = random({4, 32}, 41, 1.0), w = random({16, 32}, 42, 0.2), dy = random({4, 16}, 43, 1.0);
    for (int64_t r = 0; r < 4; ++r)
        for (int64_t c = 16; c < 32; ++c) x.set(r * 32 + c, x.item(r * 32 + c) * (r < 2 ? 2e-5 : 1.0));
    for (int64_t i = 0; i < 16 * 32; ++i)
        if (i % 32 >= 16) w.set(i, w.item(i) * 1e5);
    for (int64_t r = 0; r < 2; ++r)
        for (int64_t c = 8; c < 16; ++c) dy.set(r * 16 + c, dy.item(r * 16 + c) * 2e-5);
    Float8Gemms f;
    REQUIRE(float8_recipe_named("rowwise", &f.recipe));
    RunContext one = cpu_context(1);
    Tensor want_y({4, 16}, DType::float32), want_dx({4, 32}, DType::float32);
    float8_forward(one, f, x, Parameter{w, {}}, want_y);
    float8_input_grad(one, f, float8_backward_amax(one, f, dy, x, Parameter{w, {}}), dy, Parameter{w, {}},
                      want_dx);
    auto on_tp2 = [&](bool reduce) {  // {y, dx}: the ranks' partial products summed in rank order
        Float8Gemms g = f;
        g.recipe.reduce_amax = reduce;
        std::vector<Tensor> ys(2), dxs(2);
        run_rank_threads(2, CommOptions{}, [&](Communicator& tp) {
            const int r = tp.rank();
            RunContext ctx = cpu_context(1);
            ctx.tp = &tp;
            Float8Gemms row = g, col = g;
            row.tp.input.cols = row.tp.weight.cols = true;
            col.tp.grad_output.cols = col.tp.weight.rows = true;
            const Tensor xr = x.narrow(1, 16 * r, 16).clone(), wr = w.narrow(1, 16 * r, 16).clone();
            Tensor y({4, 16}, DType::float32);
            float8_forward(ctx, row, xr, Parameter{wr, {}}, y);
            const Tensor dyr = dy.narrow(1, 8 * r, 8).clone(), wc = w.narrow(0, 8 * r, 8).clone();
            Tensor dx({4, 32}, DType::float32);
            float8_input_grad(ctx, col, float8_backward_amax(ctx, col, dyr, x, Parameter{wc, {}}), dyr,
                              Parameter{wc, {}}, dx);
            ys[r] = y, dxs[r] = dx;
        });
        be_sum(ys[0], ys[1]), be_sum(dxs[0], dxs[1]);
        return std::pair{ys[0], dxs[0]};
    };
    auto close = [](const Tensor& got, const Tensor& want) {  // each row against its own magnitude
        const int64_t cols = want.size(1);
        for (int64_t r = 0; r < want.size(0); ++r) {
            double worst = 0, scale = 0;
            for (int64_t i = r * cols; i < (r + 1) * cols; ++i)
                worst = std::max(worst, std::fabs(got.item(i) - want.item(i))),
                scale = std::max(scale, std::fabs(want.item(i)));
            if (scale == 0 || worst > 1e-6 * scale) return false;
        }
        return true;
    };
    const auto [y, dx] = on_tp2(true);
    CHECK(close(y, want_y));
    CHECK(close(dx, want_dx));
    const auto [y_local, dx_local] = on_tp2(false);  // each half scaled by its own amax
    CHECK_FALSE(close(y_local, want_y));
    CHECK_FALSE(close(dx_local, want_dx));
}

}  // namespace test_float8_linear

namespace test_float8_linear {

namespace {

// One float8 linear's forward and backward (x [64, 32], w [16, 32], bfloat16) counted on meta
// tensors from a fresh count.
MetaWork count_linear_step(const Parameter& w) {
    meta_work() = MetaWork{};
    RunContext ctx;
    ctx.backend = &backend_for(Device::meta);
    const Tensor x = Tensor::empty({64, 32}, DType::bfloat16, Device::meta),
                 dy = Tensor::empty({64, 16}, DType::bfloat16, Device::meta);
    Tensor y = Tensor::empty({64, 16}, DType::bfloat16, Device::meta),
           dx = Tensor::empty({64, 32}, DType::bfloat16, Device::meta),
           dw = Tensor::empty({16, 32}, DType::bfloat16, Device::meta);
    const Float8Gemms f;
    float8_forward(ctx, f, x, w, y);
    const Float8BackwardAmax a = float8_backward_amax(ctx, f, dy, x, w);
    float8_input_grad(ctx, f, a, dy, w, dx);
    float8_weight_grad(ctx, f, a, dy, x, dw);
    return meta_work();
}

OpCount op(const MetaWork& w, OpClass c, DType dt) {
    auto it = w.ops.find({c, dt});
    return it == w.ops.end() ? OpCount{} : it->second;
}

}  // namespace

TEST_CASE("a float8 linear counts torchao's casts and layout copies, not the emulation's epilogue", "[cpu]") {
    MetaAllocation meta;
    const double x = 64 * 32, w = 16 * 32, dy = 64 * 16;
    const MetaWork step =
        count_linear_step(Parameter{Tensor::empty({16, 32}, DType::bfloat16, Device::meta), {}});
    // the three GEMMs as float8 GEMMs writing bfloat16
    REQUIRE(step.gemms.size() == 3);
    for (const auto& [key, calls] : step.gemms)
        CHECK((key.float8 && key.dtype == DType::bfloat16 && calls == 1));
    // torchao's six dynamic casts: the input and the weight (forward), the output gradient and the
    // weight (dgrad), the output gradient and the input again (wgrad)
    const double cast = 2 * x + 2 * w + 2 * dy;
    const OpCount amax = op(step, OpClass::float8_amax_tensorwise, DType::bfloat16),
                  scaled = op(step, OpClass::float8_cast_tensorwise, DType::bfloat16);
    CHECK((amax.elements == cast && amax.kernels == 6 * 6));
    CHECK((scaled.elements == cast && scaled.kernels == 6 * 4));
    CHECK(step.ops.size() == 2);
    CHECK(framework_bytes(OpClass::float8_amax_tensorwise, DType::bfloat16) == 6);
    CHECK(framework_bytes(OpClass::float8_cast_tensorwise, DType::bfloat16) == 27);  // 6 + 8 + 8 + 5
    // the other bytes are _scaled_mm's layout copies of float8 operands (dgrad's weight, wgrad's
    // output gradient and input), one kernel each: no epilogue, no gradient accumulation
    CHECK(step.memory_bytes == 2 * (w + dy + x));
    CHECK(step.kernels == 3);
    // under torch.compile (the plan's compile): each cast an amax reduction and one fused cast
    // writing the layout the GEMM takes, no copies
    const Float8Compiled compiled(true);
    const MetaWork fused =
        count_linear_step(Parameter{Tensor::empty({16, 32}, DType::bfloat16, Device::meta), {}});
    const OpCount famax = op(fused, OpClass::float8_amax_compiled, DType::bfloat16),
                  fcast = op(fused, OpClass::float8_cast_compiled, DType::bfloat16);
    CHECK((famax.elements == cast && famax.kernels == 6 * 2 && fcast.elements == cast && fcast.kernels == 6));
    CHECK((fused.ops.size() == 2 && fused.memory_bytes == 0 && fused.kernels == 0));
    CHECK((framework_bytes(OpClass::float8_amax_compiled, DType::bfloat16) == 2 &&
           framework_bytes(OpClass::float8_cast_compiled, DType::bfloat16) == 3));
}

TEST_CASE("a weight gathered in float8 is not cast by its linear, its shard is by the gather", "[cpu]") {
    MetaAllocation meta;
    const double x = 64 * 32, w = 16 * 32, dy = 64 * 16;
    const MetaWork step =
        count_linear_step(Parameter{Tensor::empty({16, 32}, DType::uint8, Device::meta), {}, 0.5f});
    REQUIRE(step.gemms.size() == 3);
    const OpCount amax = op(step, OpClass::float8_amax_tensorwise, DType::bfloat16),
                  scaled = op(step, OpClass::float8_cast_tensorwise, DType::bfloat16);
    CHECK((amax.elements == 2 * x + 2 * dy && amax.kernels == 4 * 6));
    CHECK((scaled.elements == 2 * x + 2 * dy && scaled.kernels == 4 * 4));
    CHECK(step.memory_bytes == 2 * (w + dy + x));  // dgrad still copies the float8 weight's layout
    // fully_shard's pre-all-gather cast of a float32 shard: the scaled cast without the upcast
    meta_work() = MetaWork{};
    const Tensor shard = Tensor::empty({8, 32}, DType::float32, Device::meta);
    Tensor codes = Tensor::empty({8, 32}, DType::uint8, Device::meta);
    float8_cast_codes(shard, Float8Format::e4m3fn, 1.f, codes);
    const OpCount pre = op(meta_work(), OpClass::float8_cast_tensorwise, DType::float32);
    CHECK((pre.elements == 256 && pre.kernels == 3));
    CHECK(framework_bytes(OpClass::float8_cast_tensorwise, DType::float32) == 21);
}

}  // namespace test_float8_linear
