// Every module type's backward against central finite differences in float64.
// The loss is mse against a random target (or cross_entropy), so the output gradient is not uniform.
#include <cmath>

#include "model/batch.h"
#include "model/loss.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_gradcheck {

namespace {

double run_loss(Model& m, const Batch& b, Tensor* dx) {
    Backend& be = backend_for(Device::cpu);
    for (const auto& [n, p] : m.named_parameters()) be.fill(p->grad, 0.0);
    RunContext ctx{&be, m.seed, 0, true, 0, 0, 1, {}};
    Tensor out = m.root->forward(ctx, b.input).t;
    LossResult l = compute_loss(be, m.loss, out, b.target);
    Tensor d = m.root->backward(ctx, l.grad).t;
    if (dx) *dx = d;
    return l.value;
}

// Checks up to `samples` elements of t spread over it: analytic[i] vs (f(t+h) - f(t-h)) / 2h.
void check_elements(Model& m, const Batch& b, Tensor t, const Tensor& analytic, const std::string& what) {
    const double h = 1e-6;
    const int64_t n = t.numel(), stride = std::max<int64_t>(1, n / 40);
    for (int64_t i = 0; i < n; i += stride) {
        const double v = t.item(i);
        t.set(i, v + h);
        const double up = run_loss(m, b, nullptr);
        t.set(i, v - h);
        const double down = run_loss(m, b, nullptr);
        t.set(i, v);
        const double numeric = (up - down) / (2 * h);
        INFO(what << "[" << i << "]: analytic " << analytic.item(i) << " numeric " << numeric);
        REQUIRE(std::abs(analytic.item(i) - numeric) <= 1e-7 + 1e-5 * std::abs(numeric));
    }
}

void gradcheck(const std::string& modules, const std::string& batch = "input: [3, 4]\n  target: [3, 4]",
               const std::string& loss = "mse") {
    const std::string yaml = "seed: 11\nbatch:\n  " + batch + "\nloss: " + loss + "\nmodules:\n" + modules;
    Model m = load_model_text(yaml, "gradcheck.yaml", "float64");
    DataSource data(m);
    Batch b = data.batch(0);
    Tensor dx;
    run_loss(m, b, &dx);
    std::vector<std::pair<std::string, Tensor>> grads;
    for (const auto& [name, p] : m.named_parameters()) grads.emplace_back(name, p->grad.clone());
    REQUIRE((!grads.empty() || dx.defined()));
    auto params = m.named_parameters();
    for (size_t k = 0; k < params.size(); ++k)
        check_elements(m, b, params[k].second->value, grads[k].second, params[k].first);
    if (dx.defined()) check_elements(m, b, b.input, dx.clone(), "input");
}

}  // namespace

TEST_CASE("gradcheck: linear with and without bias", "[cpu][gradcheck]") {
    gradcheck(
        "  - {name: a, type: linear, in: 4, out: 5}\n  - {name: b, type: linear, in: 5, out: 4, bias: "
        "false}\n");
}

TEST_CASE("gradcheck: activations", "[cpu][gradcheck]") {
    for (std::string act : {"relu", "gelu", "silu", "tanh", "identity"}) {
        INFO(act);
        gradcheck("  - {name: a, type: linear, in: 4, out: 4}\n  - {name: f, type: " + act + "}\n");
    }
    gradcheck("  - {name: a, type: linear, in: 4, out: 4}\n  - {name: f, type: gelu, approximate: tanh}\n");
}

TEST_CASE("gradcheck: layer_norm, rms_norm, batch_norm", "[cpu][gradcheck]") {
    gradcheck("  - {name: a, type: linear, in: 4, out: 4}\n  - {name: n, type: layer_norm, dim: 4}\n");
    gradcheck("  - {name: n, type: layer_norm, dim: 4, elementwise_affine: false}\n");
    gradcheck("  - {name: a, type: linear, in: 4, out: 4}\n  - {name: n, type: rms_norm, dim: 4}\n");
    gradcheck(
        "  - {name: a, type: linear, in: 4, out: 4}\n  - {name: n, type: batch_norm, features: 4}\n"
        "  - {name: b, type: linear, in: 4, out: 4}\n");
}

TEST_CASE("gradcheck: embedding with a tied head and cross_entropy", "[cpu][gradcheck]") {
    gradcheck(
        "  - {name: wte, type: embedding, vocab: 7, dim: 4}\n  - {name: n, type: layer_norm, dim: 4}\n"
        "  - {name: head, type: linear, in: 4, out: 7, bias: false, tie: wte}\n",
        "input: {tokens: [2, 3], vocab: 7}", "cross_entropy");
}

TEST_CASE("gradcheck: dropout uses one mask per step", "[cpu][gradcheck]") {
    gradcheck("  - {name: a, type: linear, in: 4, out: 4}\n  - {name: d, type: dropout, p: 0.3}\n");
    // p 1 (nn.Dropout allows it): every element dropped, the gradient through it zero, nothing non-finite
    gradcheck(
        "  - {name: a, type: linear, in: 4, out: 4}\n  - {name: d, type: dropout, p: 1.0}\n"
        "  - {name: b, type: linear, in: 4, out: 4}\n");
}

TEST_CASE("gradcheck: attention, causal, grouped-query", "[cpu][gradcheck]") {
    const std::string batch = "input: [2, 3, 8]\n  target: [2, 3, 8]";
    gradcheck("  - {name: attn, type: attention, dim: 8, heads: 2}\n", batch);
    gradcheck("  - {name: attn, type: attention, dim: 8, heads: 4, kv_heads: 2, causal: true, bias: false}\n",
              batch);
}

TEST_CASE("gradcheck: attention with rotary embeddings and per-projection bias", "[cpu][gradcheck]") {
    const std::string batch = "input: [2, 5, 8]\n  target: [2, 5, 8]";
    gradcheck(
        "  - {name: attn, type: attention, dim: 8, heads: 2, kv_heads: 1, causal: true, qkv_bias: true, "
        "o_bias: false, "
        "rope_theta: 10000.0}\n",
        batch);
}

TEST_CASE("gradcheck: attention with its own head_dim and q/k norms (Qwen3's per head, OLMo2's whole)",
          "[cpu][gradcheck]") {
    const std::string batch = "input: [2, 5, 8]\n  target: [2, 5, 8]";
    gradcheck(
        "  - {name: attn, type: attention, dim: 8, heads: 4, kv_heads: 2, head_dim: 6, causal: true, "
        "bias: false, qk_norm: true, rope_theta: 10000.0}\n",
        batch);
    gradcheck("  - {name: attn, type: attention, dim: 8, heads: 2, head_dim: 2, qk_norm: true}\n", batch);
    // OLMo2's: q and k normalised over all their features at once, before the heads are split
    gradcheck(
        "  - {name: attn, type: attention, dim: 8, heads: 4, kv_heads: 2, causal: true, bias: false, "
        "qk_norm: full, rope_theta: 10000.0}\n",
        batch);
}

TEST_CASE("gradcheck: moe, each router family and the shared expert", "[cpu][gradcheck]") {
    // routing is piecewise constant in the logits: the finite differences stay inside one routing
    // (no token's k-th and (k+1)-th scores within 1e-6), and the weights' gradient reaches the gate
    const std::string batch = "input: [2, 3, 8]\n  target: [2, 3, 8]";
    for (const std::string keys :
         {"top_k: 2", "top_k: 2, shared_hidden: 6, shared_gate: true", "top_k: 1, norm_topk_prob: false",
          "top_k: 3, norm_topk_prob: false, shared_hidden: 5",
          "top_k: 2, score_func: sigmoid, selection_bias: true, routed_scaling_factor: 2.5"}) {
        INFO(keys);
        gradcheck("  - {name: moe, type: moe, dim: 8, hidden: 6, experts: 4, " + keys + "}\n", batch);
    }
}

TEST_CASE("gradcheck: gated_mlp and containers (repeat, residual, shared)", "[cpu][gradcheck]") {
    gradcheck("  - {name: mlp, type: gated_mlp, dim: 4, hidden: 6}\n");
    gradcheck(
        "  - name: layers\n    type: repeat\n    count: 2\n    modules:\n"
        "      - {name: net1, type: linear, in: 4, out: 4}\n      - {name: act, type: tanh}\n"
        "  - name: res\n    type: residual\n    modules:\n      - {name: l, type: linear, in: 4, out: 4}\n"
        "  - {name: again, type: shared, module: layers.0}\n");
}

TEST_CASE("gradcheck: position_embedding, alone and after a token embedding (GPT-2's wte + wpe)",
          "[cpu][gradcheck]") {
    // more positions than the sequence: rows past T get no gradient, as nn.Embedding's unused rows
    gradcheck(
        "  - {name: wpe, type: position_embedding, positions: 5, dim: 4}\n  - {name: a, type: linear, in: 4, "
        "out: 4}\n",
        "input: [2, 3, 4]\n  target: [2, 3, 4]");
    gradcheck(
        "  - {name: wte, type: embedding, vocab: 7, dim: 4}\n  - {name: wpe, type: position_embedding, "
        "positions: 4, dim: 4}\n"
        "  - {name: n, type: layer_norm, dim: 4}\n  - {name: head, type: linear, in: 4, out: 7, bias: false, "
        "tie: wte}\n",
        "input: {tokens: [2, 3], vocab: 7}", "cross_entropy");
}

TEST_CASE("gradcheck: flash attention (recomputes the probabilities per head in backward)",
          "[cpu][gradcheck]") {
    const std::string batch = "input: [2, 5, 8]\n  target: [2, 5, 8]";
    gradcheck("  - {name: attn, type: attention, dim: 8, heads: 2, attn_implementation: flash}\n", batch);
    gradcheck(
        "  - {name: attn, type: attention, dim: 8, heads: 4, kv_heads: 2, causal: true, qkv_bias: true, "
        "o_bias: false, "
        "rope_theta: 10000.0, attn_implementation: flash}\n",
        batch);
}

namespace {

// The loss of one forward of a float64 model (no backward): to tell two models apart.
double loss_of(const std::string& modules, const std::string& batch) {
    Model m = load_model_text("seed: 11\nbatch:\n  " + batch + "\nloss: mse\nmodules:\n" + modules,
                              "gradcheck.yaml", "float64");
    DataSource data(m);
    return run_loss(m, data.batch(0), nullptr);
}

}  // namespace

TEST_CASE("gradcheck: attention with rope_scaling (linear, Llama 3.1's llama3)", "[cpu][gradcheck]") {
    // head_dim 8: inv_freq 1, 0.1, 0.01, 0.001 (wavelengths 6.3, 63, 628, 6283). With
    // original_max_position_embeddings 16 llama3 blends the first (between 16/4 and 16/1) and
    // divides the other three by factor, so both of its branches run.
    const std::string batch = "input: [2, 6, 16]\n  target: [2, 6, 16]";
    const std::string attn =
        "  - {name: attn, type: attention, dim: 16, heads: 2, causal: true, rope_theta: 10000.0";
    const std::string linear = attn + ", rope_scaling: {type: linear, factor: 4.0}}\n";
    const std::string llama3 =
        attn +
        ", rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
        "original_max_position_embeddings: 16}}\n";
    // the scaled frequencies reach the forward (else this would check plain RoPE again)
    const double plain = loss_of(attn + "}\n", batch);
    CHECK(loss_of(linear, batch) != plain);
    CHECK(loss_of(llama3, batch) != plain);
    CHECK(loss_of(llama3, batch) != loss_of(linear, batch));
    gradcheck(linear, batch);
    gradcheck(llama3, batch);
    gradcheck(attn +
                  ", kv_heads: 1, attn_implementation: flash, rope_scaling: {type: llama3, factor: 8.0, "
                  "original_max_position_embeddings: 16}}\n",
              batch);
}

}  // namespace test_gradcheck
