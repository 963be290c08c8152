// Model YAML: PyTorch names, default init, and every kind of bad input as a positioned error.
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "core/tensor_ops.h"
#include "model/batch.h"
#include "model/drawn_cache.h"
#include "model/layers.h"
#include "model/model.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_model_load {

namespace {
std::vector<std::string> names(const std::vector<std::pair<std::string, ParamPtr>>& v) {
    std::vector<std::string> out;
    for (const auto& [n, p] : v) out.push_back(n);
    return out;
}
const std::string kHead = "batch: {input: [4, 2]}\nmodules:\n";
}  // namespace

TEST_CASE("FQNs follow PyTorch: ModuleList indices, nested children, shared and tied names", "[cpu]") {
    Model stacked = load_model(PTOOL_SOURCE_DIR "/models/mlp_stacked.yaml");
    CHECK(names(stacked.named_parameters()) ==
          std::vector<std::string>{"layers.0.net1.weight", "layers.0.net1.bias", "layers.0.net2.weight",
                                   "layers.0.net2.bias", "layers.1.net1.weight", "layers.1.net1.bias",
                                   "layers.1.net2.weight", "layers.1.net2.bias"});
    Model shared = load_model(PTOOL_SOURCE_DIR "/models/mpy_shared.yaml");
    auto sd = names(shared.state_dict());
    CHECK(std::find(sd.begin(), sd.end(), "m2.1.running_var") != sd.end());
    CHECK(std::find(sd.begin(), sd.end(), "m1.m.1.num_batches_tracked") != sd.end());
    CHECK(shared.named_parameters().size() == 6);  // one module, registered twice
    Model gpt = load_model(PTOOL_SOURCE_DIR "/models/gpt_block.yaml");
    auto gp = names(gpt.named_parameters());
    CHECK(std::find(gp.begin(), gp.end(), "lm_head.weight") == gp.end());  // tied: first name only
    CHECK(std::find(gp.begin(), gp.end(), "attn_block.attn.q_proj.weight") != gp.end());
    auto gs = names(gpt.state_dict());
    CHECK(std::find(gs.begin(), gs.end(), "lm_head.weight") != gs.end());
    CHECK(gpt.output_shape == Shape{4, 16, 64});
}

TEST_CASE("default init: nn.Linear U(-1/sqrt(in), 1/sqrt(in)), nn.Embedding N(0, 1), norms ones and zeros",
          "[cpu]") {
    Model m = load_model_text(kHead +
                                  "  - {name: a, type: linear, in: 2, out: 400}\n"
                                  "  - {name: n, type: layer_norm, dim: 400}\n",
                              "m.yaml");
    const Tensor& w = m.named_parameters()[0].second->value;
    const double bound = 1 / std::sqrt(2.0);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
        REQUIRE(std::abs(w.item(i)) <= bound);
        sum += w.item(i), sq += w.item(i) * w.item(i);
    }
    CHECK(std::abs(sum / w.numel()) < 0.05);
    CHECK(std::abs(sq / w.numel() - bound * bound / 3) < 0.02);  // variance of U(-b, b) is b^2 / 3
    CHECK(m.named_parameters()[2].second->value.item(7) == 1.0);
    CHECK(m.named_parameters()[3].second->value.item(7) == 0.0);
    Model e = load_model_text(
        "batch: {input: {tokens: [2], vocab: 5000}}\nmodules:\n"
        "  - {name: emb, type: embedding, vocab: 5000, dim: 4}\n",
        "e.yaml");
    const Tensor& ew = e.named_parameters()[0].second->value;
    double esq = 0;
    for (int64_t i = 0; i < ew.numel(); ++i) esq += ew.item(i) * ew.item(i);
    CHECK(std::abs(esq / ew.numel() - 1.0) < 0.05);
}

TEST_CASE("bad model files exit as input errors at file:line:column", "[cpu]") {
    auto bad = [](const std::string& text, std::initializer_list<std::string> frags) {
        require_input_error([&] { load_model_text(text, "bad.yaml"); }, frags);
    };
    bad("batch: {input: [4, 2]\nmodules: []\n", {"bad.yaml:"});  // malformed
    bad(kHead + "  - {name: a, type: linear, in: 2, out: 2, biass: true}\n",
        {"bad.yaml:3:", "unknown key 'biass'", "did you mean 'bias'"});
    bad(kHead + "  - {name: a, type: linear, in: 2, in: 3, out: 2}\n", {"bad.yaml:3:", "duplicate key 'in'"});
    bad(kHead + "  - {name: a, type: linear, in: two, out: 2}\n", {"bad.yaml:3:", "'in' must be an integer"});
    bad(kHead + "  - {name: a, type: linear, out: 2}\n", {"bad.yaml:3:", "missing the key 'in'"});
    bad(kHead + "  - {name: a, type: linear, in: 2, out: 0}\n", {"bad.yaml:3:", "'out' must be positive"});
    bad(kHead + "  - {name: a, type: linear, in: 2, out: -4}\n", {"must be positive"});
    bad(kHead + "  - {name: a, type: lienar, in: 2, out: 2}\n",
        {"bad.yaml:3:", "unknown module type 'lienar'", "'linear'"});
    bad(kHead + "  - {name: a, type: shared, module: nope}\n", {"bad.yaml:3:", "names no earlier module"});
    bad(kHead + "  - {name: a, type: linear, in: 2, out: 2, tie: b}\n", {"'tie: b' names no earlier module"});
    bad(kHead +
            "  - {name: a, type: linear, in: 2, out: 3}\n  - {name: b, type: linear, in: 3, out: 2, tie: "
            "a}\n",
        {"bad.yaml:4:", "'tie: a' weight is [3, 2]", "needs [2, 3]"});
    bad(kHead + "  - {name: a, type: linear, in: 3, out: 2}\n",
        {"bad.yaml:3:", "linear 'a' expects inputs [..., 3], got [4, 2]"});
    bad(kHead + "  - {name: a, type: linear, in: 2, out: 2}\n  - {name: a, type: relu}\n",
        {"duplicate module name 'a'"});
    bad(kHead + "  - {name: a, type: attention, dim: 6, heads: 4}\n", {"not divisible by heads"});
    bad(kHead + "  - {name: a.b, type: relu}\n", {"without dots"});
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\nloss: hinge\n",
        {"bad.yaml:4:7", "unknown loss 'hinge'"});
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\noptimizer: {type: adam}\n",
        {"unknown optimizer 'adam'", "'adamw'"});
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\ndtype: float8\n",
        {"bad.yaml:4:8", "unknown dtype"});
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\nsteps: 0\n",
        {"'steps' must be positive"});
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\ngradient_accumulation: 3\n",
        {"bad.yaml:4:24", "gradient_accumulation 3 does not divide the batch's 4 rows"});
    bad("batch: {input: [131072, 2]}\nmodules:\n  - {name: a, type: relu}\ngradient_accumulation: 131072\n",
        {"bad.yaml:4:24", "gradient_accumulation 131072 is over the limit of 65536"});
    bad("modules:\n  - {name: a, type: relu}\n", {"missing the key 'batch'"});
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\nclip_grad_norm: -1\n",
        {"bad.yaml:4:17", "clip_grad_norm must be a finite number >= 0 (0: no clipping), got -1"});
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\nclip_grad_norm: .nan\n",
        {"bad.yaml:4:17", "'clip_grad_norm' must be a finite number"});
    // 0 is the documented default: no clipping (docs/model_format.md's example writes it)
    CHECK(load_model_text("batch: {input: [4, 2]}\nmodules:\n  - {name: a, type: relu}\nclip_grad_norm: 0\n",
                          "m.yaml")
              .clip_grad_norm == 0);
    bad("batch: {input: [4, 2]}\nmodules:\n  - {name: e, type: embedding, vocab: 4, dim: 2}\n",
        {"must be {tokens, vocab}"});
}

TEST_CASE("init files are strict like load_state_dict, data files check names, shapes and ids", "[cpu]") {
    Model m = load_model_text(kHead + "  - {name: a, type: linear, in: 2, out: 3}\n", "m.yaml");
    TensorFile f;
    f.add("a.weight", Tensor({3, 2}, DType::float64));
    require_input_error([&] { load_state_dict(m, f, "init.st"); }, {"init.st", "missing key 'a.bias'"});
    f.add("a.bias", Tensor({4}, DType::float32));
    require_input_error([&] { load_state_dict(m, f, "init.st"); }, {"'a.bias' is [4]"});
    f.tensors.back().second = Tensor::full({3}, DType::float32, 0.5);
    f.add("a.bais", Tensor({3}, DType::float32));
    require_input_error([&] { load_state_dict(m, f, "init.st"); }, {"unexpected key 'a.bais'"});
    f.tensors.pop_back();
    load_state_dict(m, f, "init.st");
    CHECK(m.named_parameters()[1].second->value.item(2) == 0.5);

    TensorFile d;
    d.add("inputs", Tensor({4, 2}, DType::float32));
    require_input_error([&] { DataSource(m, &d, "data.st"); },
                        {"data.st", "unexpected tensor 'inputs'", "'input'"});
    d.tensors[0] = {"step1.input", Tensor({4, 3}, DType::float32)};
    require_input_error([&] { DataSource(m, &d, "data.st"); }, {"'step1.input' is [4, 3]"});
}

TEST_CASE(
    "a shard's init draws exactly the full tensor's slice (uniform and normal, any dim, uneven offsets)",
    "[cpu]") {
    const Shape full{7, 5, 3};
    Tensor whole_u(full, DType::float32), whole_n(full, DType::float32);
    init_uniform(whole_u, 11, "w", 0.5);
    init_normal(whole_n, 11, "w", 2.0);
    const CounterRng rng(11, stream_id("init", "w"));  // element i is a function of i alone
    for (int64_t i = 0; i < whole_u.numel(); ++i) {
        CHECK(whole_u.item(i) == static_cast<float>(-0.5 + 1.0 * rng.uniform(static_cast<uint64_t>(i))));
        CHECK(whole_n.item(i) == static_cast<float>(2.0 * rng.normal(static_cast<uint64_t>(i))));
    }
    drawn_tensors().clear();  // the shards draw their own runs, not the whole tensors' copies
    for (int64_t dim = 0; dim < 3; ++dim)
        for (int64_t offset = 0; offset < full[dim]; offset += 2) {
            const int64_t len = std::min<int64_t>(2, full[dim] - offset);
            Shape local = full;
            local[dim] = len;
            Tensor u(local, DType::float32), n(local, DType::float32);
            init_uniform_shard(u, 11, "w", 0.5, full, dim, offset);
            init_normal_shard(n, 11, "w", 2.0, full, dim, offset);
            const int parts = static_cast<int>((full[dim] + 1) / 2);  // torch.chunk's pieces of 2
            CHECK(same_bits(u, chunk(whole_u, parts, static_cast<int>(offset / 2), dim)));
            CHECK(same_bits(n, chunk(whole_n, parts, static_cast<int>(offset / 2), dim)));
        }
}

TEST_CASE("a whole init drawn once: later shards and wholes copy it, bitwise, and own their copies",
          "[cpu]") {
    const Shape full{6, 6};
    drawn_tensors().clear();
    Tensor whole(full, DType::float32);
    init_uniform(whole, 5, "cached.w", 0.25);
    const Tensor expected = whole.clone();
    whole.set(0, 1e6);  // the drawing run's own tensor: the cache kept a copy
    const CounterRng rng(5, stream_id("init", "cached.w"));
    for (int64_t dim = 0; dim < 2; ++dim)
        for (int64_t offset = 0; offset < full[dim]; offset += 3) {
            Shape local = full;
            local[dim] = 3;
            Tensor shard(local, DType::float32);
            init_uniform_shard(shard, 5, "cached.w", 0.25, full, dim, offset);
            CHECK(same_bits(shard, chunk(expected, 2, static_cast<int>(offset / 3), dim)));
            shard.set(0, -1e6);  // a copy, not the cache's storage
        }
    Tensor again(full, DType::float32);
    init_uniform(again, 5, "cached.w", 0.25);
    CHECK(same_bits(again, expected));
    CHECK(again.item(0) == static_cast<float>(-0.25 + 0.5 * rng.uniform(0)));
    // keyed by everything the values depend on: another bound, seed, dtype or shape draws anew
    Tensor wider(full, DType::float32), reseeded(full, DType::float32), half(full, DType::bfloat16),
        longer({7, 6}, DType::float32);
    init_uniform(wider, 5, "cached.w", 0.5);
    init_uniform(reseeded, 6, "cached.w", 0.25);
    init_uniform(half, 5, "cached.w", 0.25);
    init_uniform(longer, 5, "cached.w", 0.25);
    CHECK(wider.item(1) == static_cast<float>(-0.5 + 1.0 * rng.uniform(1)));
    CHECK(reseeded.item(1) ==
          static_cast<float>(-0.25 + 0.5 * CounterRng(6, stream_id("init", "cached.w")).uniform(1)));
    CHECK(half.dtype() == DType::bfloat16);
    CHECK(half.item(1) ==
          static_cast<double>(static_cast<float>(bf16_t(static_cast<float>(-0.25 + 0.5 * rng.uniform(1))))));
    CHECK(same_bits(longer.narrow(0, 0, 6), expected));  // element i is a function of i alone
    Tensor normal(full, DType::float32);
    init_normal(normal, 5, "cached.w", 0.25);  // the same scale, another distribution
    CHECK(normal.item(1) == static_cast<float>(0.25 * rng.normal(1)));
}

TEST_CASE("DrawnCache keeps tensors up to a quarter of its budget, the most recent first", "[cpu]") {
    DrawnCache cache(4096);
    const Tensor quarter = Tensor::full({256}, DType::float32, 1.0),
                 half = Tensor::full({512}, DType::float32, 2.0);
    cache.keep("half", half);
    CHECK_FALSE(cache.find("half").defined());  // 2 KiB of a 4 KiB budget: drawn by whoever needs it
    for (int k = 0; k < 5; ++k) cache.keep(std::to_string(k), Tensor::full({256}, DType::float32, k));
    CHECK_FALSE(cache.find("0").defined());  // five 1 KiB tensors: the oldest went
    for (int k = 1; k < 5; ++k) CHECK(cache.find(std::to_string(k)).item(3) == k);
    int draws = 0;
    const Tensor got = cache.find_or_draw("4", [&] { return ++draws, quarter; });
    CHECK(draws == 0);
    CHECK(got.item(0) == 4.0);
    cache.find_or_draw("new", [&] { return ++draws, quarter; });
    cache.find_or_draw("new", [&] { return ++draws, quarter; });
    CHECK(draws == 1);
}

TEST_CASE("generated data: drawn once, every caller gets its own copy of the same values", "[cpu]") {
    const TensorSpec spec{{64, 33}, false, 0};
    Tensor a = generate_tensor(spec, DType::float32, 3, "input");
    const Tensor b = generate_tensor(spec, DType::float32, 3, "input");
    CHECK(!a.shares_storage(b));
    CHECK(same_bits(a, b));
    const CounterRng rng(3, stream_id("data", "input"));
    for (int64_t i = 0; i < a.numel(); i += 97)
        CHECK(a.item(i) == static_cast<float>(rng.normal(static_cast<uint64_t>(i))));
    a.set(0, 1e6);  // a caller's copy is its own
    CHECK(generate_tensor(spec, DType::float32, 3, "input").item(0) == b.item(0));
    const Tensor half = generate_tensor(spec, DType::bfloat16, 3, "input");  // keyed by dtype
    CHECK(half.dtype() == DType::bfloat16);
    CHECK(half.item(1) == static_cast<double>(static_cast<float>(bf16_t(static_cast<float>(rng.normal(1))))));
    const Tensor ids = generate_tensor({{100}, true, 7}, DType::float32, 3, "target");
    const CounterRng targets(3, stream_id("data", "target"));
    CHECK(ids.dtype() == DType::int64);
    for (int64_t i = 0; i < ids.numel(); ++i)
        CHECK(ids.item(i) == static_cast<double>(targets.below(static_cast<uint64_t>(i), 7)));
}

}  // namespace test_model_load
