// The reference training loop: reproducibility, optimizer rules, dtypes, per-step data.
#include <cmath>

#include "model/batch.h"
#include "test_helpers.h"
#include "verify/golden.h"

using namespace ptool;

namespace test_training {

namespace {

RunInputs inputs(const std::string& text, const std::string& dtype = "", const TensorFile* data = nullptr) {
    RunInputs in;
    in.model_path = "m.yaml";
    in.model_text = text;
    in.dtype_override = dtype;
    in.data = data;
    return in;
}

// The reference loop (`ptool run`'s): every step's tensors.
RunRecord train(const RunInputs& in, int64_t steps) {
    RecordOptions ro;
    ro.init_tensors = true;
    return record_reference(in, single_device_plan(), steps, ro);
}

double item(const RunRecord& r, int64_t step, const std::string& name) {
    const Tensor* t = find_tensor(r.steps.at(step), fmt::format("step{}.{}", step, name));
    REQUIRE(t);
    return t->item(0);
}

}  // namespace

TEST_CASE("two runs of the reference are bitwise identical", "[cpu]") {
    const RunInputs in = inputs(read_text(PTOOL_SOURCE_DIR "/models/gpt_block.yaml"));
    auto once = [&] { return serialize_safetensors(golden_tensors(train(in, 2), in, 2)); };
    CHECK(once() == once());
}

TEST_CASE("SGD with momentum and weight decay follows torch.optim.SGD", "[cpu]") {
    // loss = sum(W x) for a 1x1 linear without bias: dL/dW = sum(x)
    const std::string text =
        "batch: {input: [2, 1]}\nmodules:\n  - {name: l, type: linear, in: 1, out: 1, bias: false}\n"
        "optimizer: {type: sgd, lr: 0.5, momentum: 0.9, weight_decay: 0.1}\n";
    Model m = load_model_text(text, "m.yaml", "float64");
    const double w0 = m.named_parameters()[0].second->value.item(0);
    DataSource d(m);
    const Tensor x = d.batch(0).input;
    const double g = x.item(0) + x.item(1);
    const RunRecord r = train(inputs(text, "float64"), 2);
    const double d0 = g + 0.1 * w0, w1 = w0 - 0.5 * d0;  // first step: buf = d_p
    const double d1 = g + 0.1 * w1, buf1 = 0.9 * d0 + d1, w2 = w1 - 0.5 * buf1;
    CHECK(item(r, 0, "param.l.weight") == Approx(w1).epsilon(1e-14));
    CHECK(item(r, 1, "param.l.weight") == Approx(w2).epsilon(1e-14));
}

TEST_CASE("AdamW follows torch.optim.AdamW", "[cpu]") {
    const std::string text =
        "batch: {input: [2, 1]}\nmodules:\n  - {name: l, type: linear, in: 1, out: 1, bias: false}\n"
        "optimizer: {type: adamw, lr: 0.1, betas: [0.8, 0.9], eps: 1e-8, weight_decay: 0.5}\n";
    Model m = load_model_text(text, "m.yaml", "float64");
    const double w0 = m.named_parameters()[0].second->value.item(0);
    DataSource d(m);
    const Tensor x = d.batch(0).input;
    const double g = x.item(0) + x.item(1);
    const RunRecord r = train(inputs(text, "float64"), 1);
    const double p = w0 * (1 - 0.1 * 0.5), mm = 0.2 * g, v = 0.1 * g * g;
    const double expected = p - (0.1 / 0.2) * mm / (std::sqrt(v) / std::sqrt(0.1) + 1e-8);
    CHECK(item(r, 0, "param.l.weight") == Approx(expected).epsilon(1e-12));
}

TEST_CASE("bfloat16 and float16 runs stay within their tolerance of float64", "[cpu]") {
    auto loss_of = [](const char* dtype) {
        return item(train(inputs(read_text(PTOOL_SOURCE_DIR "/models/mlp.yaml"), dtype), 1), 0, "loss");
    };
    const double ref = loss_of("float64");
    CHECK(std::abs(loss_of("bfloat16") - ref) <= 1e-5 + 3e-2 * std::abs(ref) + 0.05 * 8);
    CHECK(std::abs(loss_of("float16") - ref) <= 1e-5 + 1e-2 * std::abs(ref));
    CHECK(loss_of("bfloat16") != loss_of("float32"));  // it really ran in bf16
}

TEST_CASE("per-step data overrides the generated batch", "[cpu]") {
    const std::string text = read_text(PTOOL_SOURCE_DIR "/models/replicate_net.yaml");
    Model m = load_model_text(text, "replicate_net.yaml");
    TensorFile f;
    f.add("step1.input", Tensor::full({2, 2}, DType::float32, 3.0));
    DataSource d(m, &f, "data.st");
    CHECK(d.varies_per_step());
    const RunInputs in = inputs(text, "", &f);
    const RunRecord r = train(in, 2);
    const TensorFile golden = golden_tensors(r, in, 2);  // the batches each step trained on
    CHECK(golden.find("step1.input")->item(0) == 3.0);
    CHECK(golden.find("step0.input")->item(0) != 3.0);
    CHECK(item(r, 1, "loss") != item(r, 0, "loss"));
}

TEST_CASE("`ptool run` without --dump records each step's loss and nothing else, the same losses", "[cpu]") {
    const RunInputs in = inputs(read_text(PTOOL_SOURCE_DIR "/models/llama_rope.yaml"));
    RecordOptions loss_only;
    loss_only.events = false, loss_only.tensors = false;
    std::vector<double> printed;
    loss_only.on_step = [&](int64_t, double loss, double) { printed.push_back(loss); };
    const RunRecord slim = record_reference(in, single_device_plan(), 2, loss_only);
    const RunRecord full = train(in, 2);
    REQUIRE(slim.steps.size() == 2);
    CHECK(slim.init_state.empty());  // no digests of the state
    for (int64_t k = 0; k < 2; ++k) {
        std::vector<std::string> names;
        for (const auto& [name, t] : slim.steps[static_cast<size_t>(k)].tensors) names.push_back(name);
        // the loss, and clip_grad_norm's return (llama_rope clips at 1.0): no output, gradient or parameter
        CHECK(names ==
              std::vector<std::string>{fmt::format("step{}.loss", k), fmt::format("step{}.grad_norm", k)});
        CHECK(item(slim, k, "loss") == item(full, k, "loss"));
        CHECK(printed[static_cast<size_t>(k)] == item(full, k, "loss"));
    }
    CHECK(full.steps[1].tensors.size() > 10);  // the full record has every tensor
}

}  // namespace test_training
