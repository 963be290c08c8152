// The engine's fused attention path (model/modules/attention_fused.cpp: the kernel's arguments,
// the kv heads read as they are, o in merge_heads' layout, m and l kept, dk and dv per kv head)
// on the CPU: a backend that offers Backend::attention_forward / attention_backward through the
// oracle (tests/attention_oracle.h) against the CPU's tile path, on a causal grouped-query model
// with RoPE whose sequence spans two row tiles. The CUDA kernels are tested against the same
// oracle in test_cuda_backend (GPU only).
#include <cmath>

#include "attention_oracle.h"
#include "backend/forwarding_backend.h"
#include "model/batch.h"
#include "model/loss.h"
#include "test_helpers.h"

using namespace ptool;
using namespace ptool::testing;

namespace test_attention_fused {

namespace {

// The CPU backend with the fused ops of the oracle; gqa_as_modulo reads the wrong kv head
// (query head h from kv head h mod KV): a fault the comparison must see.
class OracleFusedBackend final : public ForwardingBackend {
public:
    OracleFusedBackend(Backend& inner, bool gqa_as_modulo)
        : ForwardingBackend(inner), wrong_(gqa_as_modulo) {}
    bool fused_attention(DType, int64_t) const override { return true; }
    void attention_forward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                           Tensor& o, Tensor& m, Tensor& l) override {
        Tensor split = a.o_merged ? Tensor::empty(q.shape(), q.dtype()) : o;
        oracle_forward(inner_, a, q, k, v, split, m, l, wrong_);
        if (a.o_merged) inner_.copy(merged_layout(inner_, split, a.batch, a.heads), o);
        ++forwards;
    }
    void attention_backward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& o, const Tensor& d_o, const Tensor& m, const Tensor& l, Tensor& dq,
                            Tensor& dk, Tensor& dv, bool accumulate_dq) override {
        const Tensor os = a.o_merged ? split_layout(inner_, o, a.batch, a.heads) : o,
                     dos = a.o_merged ? split_layout(inner_, d_o, a.batch, a.heads) : d_o;
        oracle_backward(inner_, a, q, k, v, os, dos, m, l, dq, dk, dv, accumulate_dq, wrong_);
        ++backwards;
    }
    int forwards = 0, backwards = 0;

private:
    bool wrong_;
};

struct Step {
    Tensor out, dx;
    std::vector<Tensor> grads;
};

Step step(Model& m, Backend& be, const Batch& b) {
    for (const auto& [n, p] : m.named_parameters()) backend_for(Device::cpu).fill(p->grad, 0.0);
    RunContext ctx{&be, m.seed, 0, true, 0, 0, 1, {}};
    Step s;
    s.out = m.root->forward(ctx, b.input).t;
    LossResult loss = compute_loss(be, m.loss, s.out, b.target);
    s.dx = m.root->backward(ctx, loss.grad).t;
    for (const auto& [n, p] : m.named_parameters()) s.grads.push_back(p->grad.clone());
    return s;
}

double max_rel(const Tensor& a, const Tensor& b) {
    double worst = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
        worst = std::max(worst, std::abs(a.item(i) - b.item(i)) / (1e-12 + std::abs(a.item(i))));
    return worst;
}

double worst_of(const Step& a, const Step& b) {
    double w = std::max(max_rel(a.out, b.out), max_rel(a.dx, b.dx));
    for (size_t i = 0; i < a.grads.size(); ++i) w = std::max(w, max_rel(a.grads[i], b.grads[i]));
    return w;
}

const char* kModel = R"(seed: 5
batch:
  input: [2, 200, 32]
  target: [2, 200, 32]
modules:
  - {name: attention, type: attention, dim: 32, heads: 4, kv_heads: 2, causal: true, rope_theta: 10000,
     attn_implementation: flash}
loss: mse
)";

}  // namespace

TEST_CASE("the fused attention path matches the tile path on the cpu (gqa, causal, two row tiles)", "[cpu]") {
    Model m = load_model_text(kModel, "fused.yaml", "float64");
    DataSource data(m);
    const Batch b = data.batch(0);
    Backend& cpu = backend_for(Device::cpu);
    const Step tiles = step(m, cpu, b);
    OracleFusedBackend fused(cpu, false);
    const Step kernel = step(m, fused, b);
    CHECK(fused.forwards == 1);
    CHECK(fused.backwards == 1);
    INFO("worst relative difference " << worst_of(tiles, kernel));
    CHECK(worst_of(tiles, kernel) < 1e-10);  // float64: the two paths differ in rounding only

    OracleFusedBackend wrong(cpu, true);  // query heads reading the wrong kv heads
    CHECK(worst_of(tiles, step(m, wrong, b)) > 1e-3);
}

}  // namespace test_attention_fused
