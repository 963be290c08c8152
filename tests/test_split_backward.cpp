// Zero-bubble's split backward (docs/zero_bubble.md §3.2, issue 49): a backward run with
// RunContext::weight_work set computes the input gradients only (torch's stage_backward_input) and
// leaves every parameter gradient as it was; running the work it appended (the W action,
// run_weight_work) then gives each parameter gradient of the one backward, bit for bit. Held on
// every shipped model (each module type: linear, norms, batch_norm, embeddings, attention with its
// projections and q/k norms, moe with its experts, gated MLPs, dropout, containers, tied weights).
#include <filesystem>

#include "model/batch.h"
#include "model/loss.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_split_backward {

namespace {

struct Pass {
    Tensor dx;
    std::vector<Tensor> grads_after_input, grads;
};

// One forward and backward of microbatch 0 (the step's whole batch) from zeroed gradients: whole,
// or as an I with the W work run after it.
Pass run(const std::string& text, const std::string& name, bool split) {
    Model m = load_model_text(text, name);
    Backend& be = backend_for(Device::cpu);
    for (const auto& [n, p] : m.named_parameters()) be.fill(p->grad, 0.0);
    DataSource data(m);
    const Batch b = data.batch(0);
    RunContext ctx{&be, m.seed, 0, true, 0, 0, 1, {}};
    WeightWork work;
    const Tensor out = m.root->forward(ctx, b.input).t;
    const LossResult l = compute_loss(be, m.loss, out, b.target);
    if (split) ctx.weight_work = &work;
    Pass p;
    const Tensor dx = m.root->backward(ctx, l.grad).t;
    p.dx = dx.defined() ? dx.clone() : Tensor();
    for (const auto& [n, q] : m.named_parameters()) p.grads_after_input.push_back(q->grad.clone());
    if (split) {
        ctx.weight_work = nullptr;
        REQUIRE((!work.empty() || m.named_parameters().empty()));
        run_weight_work(ctx, work);
        CHECK(work.empty());
    }
    for (const auto& [n, q] : m.named_parameters()) p.grads.push_back(q->grad.clone());
    return p;
}

bool all_zero(const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i)
        if (t.item(i) != 0.0) return false;
    return true;
}

}  // namespace

TEST_CASE("split backward: I computes no parameter gradient, I then W is the one backward bit for bit",
          "[cpu]") {
    int models = 0;
    for (const auto& entry : std::filesystem::directory_iterator(PTOOL_SOURCE_DIR "/models")) {
        const std::string stem = entry.path().stem().string();
        if (entry.path().extension() != ".yaml" || stem.rfind("gemm_mlp", 0) == 0) continue;  // bench-sized
        INFO(stem);
        const std::string text = read_text(entry.path().string());
        const Pass whole = run(text, stem + ".yaml", false), split = run(text, stem + ".yaml", true);
        REQUIRE(whole.grads.size() == split.grads.size());
        CHECK(whole.dx.defined() == split.dx.defined());
        if (whole.dx.defined()) CHECK(same_bits(whole.dx, split.dx));
        for (size_t i = 0; i < whole.grads.size(); ++i) {
            INFO("parameter " << i);
            CHECK(all_zero(split.grads_after_input[i]));  // the I left it alone
            CHECK(same_bits(whole.grads[i], split.grads[i]));
        }
        ++models;
    }
    CHECK(models >= 20);
}

}  // namespace test_split_backward
