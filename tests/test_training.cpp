// The reference training loop: reproducibility, optimizer rules, dtypes, per-step data.
#include <cmath>

#include "model/batch.h"
#include "test_helpers.h"
#include "verify/reference.h"

using namespace ptool;

namespace {
std::vector<StepResult> train(Model& m, const DataSource& d, int64_t steps) {
    std::vector<StepResult> out;
    run_reference(m, d, {steps, Device::cpu}, [&](const StepResult& r) { out.push_back(r); });
    return out;
}
}  // namespace

TEST_CASE("two runs of the reference are bitwise identical", "[cpu]") {
    auto once = [] {
        Model m = load_model(PTOOL_SOURCE_DIR "/models/gpt_block.yaml");
        DataSource d(m);
        GoldenWriter w(m, false);
        for (const auto& r : train(m, d, 2)) w.add_step(r);
        return serialize_safetensors(w.file());
    };
    CHECK(once() == once());
}

TEST_CASE("SGD with momentum and weight decay follows torch.optim.SGD", "[cpu]") {
    // loss = sum(W x) for a 1x1 linear without bias: dL/dW = sum(x)
    Model m = load_model_text("batch: {input: [2, 1]}\nmodules:\n  - {name: l, type: linear, in: 1, out: 1, bias: false}\n"
                              "optimizer: {type: sgd, lr: 0.5, momentum: 0.9, weight_decay: 0.1}\n",
                              "m.yaml", "float64");
    const double w0 = m.named_parameters()[0].second->value.item(0);
    DataSource d(m);
    const Tensor x = d.batch(0).input;
    const double g = x.item(0) + x.item(1);
    auto r = train(m, d, 2);
    const double d0 = g + 0.1 * w0, w1 = w0 - 0.5 * d0;  // first step: buf = d_p
    const double d1 = g + 0.1 * w1, buf1 = 0.9 * d0 + d1, w2 = w1 - 0.5 * buf1;
    CHECK(r[0].params[0].second.item(0) == Approx(w1).epsilon(1e-14));
    CHECK(r[1].params[0].second.item(0) == Approx(w2).epsilon(1e-14));
}

TEST_CASE("AdamW follows torch.optim.AdamW", "[cpu]") {
    Model m = load_model_text("batch: {input: [2, 1]}\nmodules:\n  - {name: l, type: linear, in: 1, out: 1, bias: false}\n"
                              "optimizer: {type: adamw, lr: 0.1, betas: [0.8, 0.9], eps: 1e-8, weight_decay: 0.5}\n",
                              "m.yaml", "float64");
    const double w0 = m.named_parameters()[0].second->value.item(0);
    DataSource d(m);
    const Tensor x = d.batch(0).input;
    const double g = x.item(0) + x.item(1);
    auto r = train(m, d, 1);
    const double p = w0 * (1 - 0.1 * 0.5), mm = 0.2 * g, v = 0.1 * g * g;
    const double expected = p - (0.1 / 0.2) * mm / (std::sqrt(v) / std::sqrt(0.1) + 1e-8);
    CHECK(r[0].params[0].second.item(0) == Approx(expected).epsilon(1e-12));
}

TEST_CASE("bfloat16 and float16 runs stay within their tolerance of float64", "[cpu]") {
    auto loss_of = [](const char* dtype) {
        Model m = load_model(PTOOL_SOURCE_DIR "/models/mlp.yaml", dtype);
        DataSource d(m);
        return train(m, d, 1)[0].loss;
    };
    const double ref = loss_of("float64");
    CHECK(std::abs(loss_of("bfloat16") - ref) <= 1e-5 + 3e-2 * std::abs(ref) + 0.05 * 8);
    CHECK(std::abs(loss_of("float16") - ref) <= 1e-5 + 1e-2 * std::abs(ref));
    CHECK(loss_of("bfloat16") != loss_of("float32"));  // it really ran in bf16
}

TEST_CASE("per-step data overrides the generated batch", "[cpu]") {
    Model m = load_model(PTOOL_SOURCE_DIR "/models/replicate_net.yaml");
    TensorFile f;
    f.add("step1.input", Tensor::full({2, 2}, DType::float32, 3.0));
    DataSource d(m, &f, "data.st");
    CHECK(d.varies_per_step());
    auto r = train(m, d, 2);
    CHECK(r[1].batch.input.item(0) == 3.0);
    CHECK(r[0].batch.input.item(0) != 3.0);
}
