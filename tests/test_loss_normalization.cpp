// Masked targets and the loss's normalisation (model/loss.h, model/target_mask.h,
// verify/loss_causes.h): what a call divides by, the counts per rank and microbatch, the causes
// verify names, and the runs that agree with one device or do not.
#include <cmath>

#include "comm/comm_choice.h"
#include "model/loss.h"
#include "model/target_mask.h"
#include "parallel/loss_parallel.h"
#include "plan/explain_report.h"
#include "same_runs.h"
#include "test_helpers.h"
#include "verify/loss_causes.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_loss_normalization {

namespace {

Model sft(const std::string& extra = "", const std::string& mask = "{prompt: [2, 9], padding: [0, 5]}") {
    const std::string text = fmt::format(R"(name: sft
seed: 21
batch:
  input: {{tokens: [8, 16], vocab: 64}}
  masked_targets: {}
modules:
  - {{name: emb, type: embedding, vocab: 64, dim: 16}}
  - {{name: out, type: linear, in: 16, out: 64}}
loss: cross_entropy
{}
)",
                                         mask, extra);
    return load_model_text(text, "sft.yaml");
}

Tensor ids(std::vector<int64_t> v) {
    Tensor t({static_cast<int64_t>(v.size())}, DType::int64);
    for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
    return t;
}

}  // namespace

TEST_CASE("masked targets: prompt and padding drawn per row, the same every time", "[cpu]") {
    const Model m = sft();
    const DataSource data(m);
    const Tensor t = data.batch(0).target;
    REQUIRE(t.shape() == Shape{8, 16});
    int64_t masked_rows = 0;
    for (int64_t r = 0; r < 8; ++r) {
        int64_t prompt = 0, padding = 0;
        while (prompt < 16 && id_at(t, r * 16 + prompt) == -100) ++prompt;
        while (padding < 16 && id_at(t, r * 16 + 15 - padding) == -100) ++padding;
        INFO("row " << r);
        CHECK(prompt >= 2);  // at least the shortest prompt; a class id drawn may follow it
        CHECK(prompt + padding <= 16);
        masked_rows += prompt + padding > 2;
        for (int64_t i = prompt; i < 16 - padding; ++i) CHECK(id_at(t, r * 16 + i) != -100);
    }
    CHECK(masked_rows >= 4);                                 // lengths differ from row to row (seed 21)
    const Tensor again = DataSource(sft()).batch(0).target;  // a pure function of the seed
    for (int64_t i = 0; i < t.numel(); ++i) CHECK(id_at(again, i) == id_at(t, i));
    // fraction: about that share of the elements
    const Tensor f = DataSource(sft("", "{fraction: 0.25}")).batch(0).target;
    const double share = 1.0 - static_cast<double>(valid_targets(f, -100)) / static_cast<double>(f.numel());
    CHECK(share > 0.15);
    CHECK(share < 0.35);
}

TEST_CASE("a loss divides its sum by the call's items or by the step's", "[cpu]") {
    Backend& be = backend_for(Device::cpu);
    Tensor logits({4, 5}, DType::float64);
    for (int64_t i = 0; i < 20; ++i) logits.data<double>()[i] = std::sin(0.7 * static_cast<double>(i));
    const Tensor target = ids({1, -100, 3, 7});  // 7: ignore_index below
    const LossResult mean = compute_loss(be, LossKind::cross_entropy, logits, ids({1, -100, 3, 0}));
    const LossResult sum10 =
        compute_loss(be, LossKind::cross_entropy, logits, ids({1, -100, 3, 0}), LossDivisor{-100, 10.0});
    // reduction='mean' over the 3 valid rows, and the same sum over 10
    CHECK(mean.value * 3.0 == Approx(sum10.value * 10.0).epsilon(1e-12));
    for (int64_t i = 0; i < 20; ++i)
        CHECK(mean.grad.data<double>()[i] * 3.0 == Approx(sum10.grad.data<double>()[i] * 10.0).margin(1e-15));
    for (int64_t j = 0; j < 5; ++j) CHECK(mean.grad.data<double>()[5 + j] == 0.0);  // the ignored row
    // another ignore_index: 7 is ignored, -100 would be a class id out of range
    const LossResult seven =
        compute_loss(be, LossKind::cross_entropy, logits, ids({1, 2, 3, 7}), LossDivisor{7, std::nullopt});
    for (int64_t j = 0; j < 5; ++j) CHECK(seven.grad.data<double>()[15 + j] == 0.0);
    CHECK_THROWS_AS(compute_loss(be, LossKind::cross_entropy, logits, target, LossDivisor{7, std::nullopt}),
                    InputError);
    // a mean over nothing: PyTorch's 0 / 0 for the loss, and zero gradients (nll_loss's backward skips
    // every ignored row; they were 0 / 0 = NaN and spread through the whole step)
    const LossResult none = compute_loss(be, LossKind::cross_entropy, logits, ids({-100, -100, -100, -100}));
    CHECK(std::isnan(none.value));
    for (int64_t i = 0; i < 20; ++i) CHECK(none.grad.data<double>()[i] == 0.0);
    CHECK(loss_items(LossKind::mse, {4, 5}, Tensor(), -100) == 20);
    CHECK(loss_items(LossKind::cross_entropy, {4, 5}, ids({1, -100, 3, 0}), -100) == 3);
}

TEST_CASE("loss_parallel: a call with no valid target has PyTorch's NaN loss and zero gradients", "[cpu]") {
    // [4, 6] logits over 2 tp ranks (3 classes each); every target ignored, then one row valid
    for (const bool one_valid : {false, true}) {
        INFO("one valid row: " << one_valid);
        const Tensor target = ids({-100, one_valid ? 4 : -100, -100, -100});
        std::vector<LossResult> out(2);
        run_ranks(
            2, CommOptions{},
            [&](Communicator& c) {
                Tensor local({4, 3}, DType::float64);
                for (int64_t i = 0; i < 12; ++i)
                    local.data<double>()[i] = std::cos(0.3 * static_cast<double>(i + 12 * c.rank()));
                const Placed logits(local, Placement::shard(-1), {4, 6});
                out[c.rank()] =
                    vocab_parallel_cross_entropy(logits, target, LossDivisor{-100, std::nullopt}, c);
            },
            Device::cpu);
        for (int r = 0; r < 2; ++r) {
            CHECK(std::isnan(out[r].value) != one_valid);
            for (int64_t i = 0; i < 12; ++i) {
                const bool valid_row = one_valid && i / 3 == 1;
                if (!valid_row) CHECK(out[r].grad.data<double>()[i] == 0.0);
                CHECK(std::isfinite(out[r].grad.data<double>()[i]));
            }
        }
    }
}

TEST_CASE("valid targets per microbatch, data rank and cp rank", "[cpu]") {
    const Model m = sft("gradient_accumulation: 2");
    const Batch b = DataSource(m).batch(0);
    const Plan plan = load_plan_text(
        "mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard}\n"
        "context_parallel: {mesh_dim: cp}\n",
        "p.yaml");
    const auto counts = valid_target_counts(m, plan, b);
    REQUIRE(counts.size() == 2);  // microbatches
    int64_t total = 0;
    for (const auto& mb : counts) {
        REQUIRE(mb.size() == 4);  // data x cp
        for (int64_t c : mb) total += c;
    }
    CHECK(total == valid_targets(b.target, -100));
    // microbatch 1, data rank 1: rows 6-7; cp rank 0 holds positions 0-3 and 12-15 (load-balanced)
    const Tensor rows = b.target.narrow(0, 6, 2);
    int64_t expect = 0;
    for (int64_t r = 0; r < 2; ++r)
        for (int64_t t : {0, 1, 2, 3, 12, 13, 14, 15}) expect += id_at(rows, r * 16 + t) != -100;
    CHECK(counts[1][2] == expect);
}

TEST_CASE("verify names the per-call normalisation of unevenly masked targets as the cause", "[cpu]") {
    const Plan ddp =
        load_plan_text("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n", "p.yaml");
    const Model per_call = sft();
    const auto causes = loss_normalization_causes(per_call, ddp, DataSource(per_call), 1, {});
    REQUIRE(causes.size() == 1);
    CHECK(causes[0].message.find("valid targets on data ranks 0-1") != std::string::npos);
    CHECK(causes[0].message.find("loss_normalization: global_tokens") != std::string::npos);
    const Model global = sft("loss_normalization: global_tokens");
    CHECK(loss_normalization_causes(global, ddp, DataSource(global), 1, {}).empty());
    // one device: microbatches of different counts are the reference's own microbatches
    const Model accumulated = sft("gradient_accumulation: 4");
    CHECK(
        loss_normalization_causes(accumulated, single_device_plan(), DataSource(accumulated), 1, {}).empty());
    // a microbatch with none: under mean_per_call its loss is NaN in both runs (PyTorch's 0 / 0), so
    // verify refuses it naming the microbatch (exit 2); global_tokens adds nothing for it and runs
    TensorFile file;
    Tensor target({8, 16}, DType::int64);
    for (int64_t i = 0; i < 8 * 16; ++i) target.data<int64_t>()[i] = i < 4 * 16 ? i % 64 : -100;
    file.add("target", target);
    for (const bool global_tokens : {false, true}) {
        const Model two = sft(std::string("gradient_accumulation: 2") +
                              (global_tokens ? "\nloss_normalization: global_tokens" : ""));
        const DataSource from_file(two, &file, "d.safetensors");
        if (global_tokens)
            CHECK(loss_normalization_causes(two, ddp, from_file, 1, {}).empty());
        else
            require_input_error(
                [&] {
                    loss_normalization_causes(two, ddp, from_file, 1, {"d.safetensors", 0, 0});
                },
                {"d.safetensors", "microbatch 1 has no valid target", "global_tokens"});
    }
    // no valid target at all: nothing to train on (exit 2)
    const Model empty = sft("", "{prompt: 16}");
    require_input_error(
        [&] {
            loss_normalization_causes(empty, ddp, DataSource(empty), 1, {"d.safetensors", 0, 0});
        },
        {"d.safetensors", "no valid target", "ignore_index -100"});
}

TEST_CASE("the model's and the plan's loss keys are checked where they are written", "[cpu]") {
    require_input_error([] { sft("loss_normalization: per_token"); },
                        {"sft.yaml:10:21", "unknown loss_normalization 'per_token'"});
    require_input_error(
        [] {
            load_model_text(
                "batch:\n  input: [4, 3]\nmodules:\n  - {name: l, type: linear, in: 3, out: 2}\n"
                "loss: sum\nloss_normalization: global_tokens\n",
                "m.yaml");
        },
        {"m.yaml:6:21", "loss: sum has none"});
    require_input_error(
        [] {
            load_model_text(
                "batch:\n  input: [4, 3]\n  masked_targets: {fraction: 0.5}\nmodules:\n"
                "  - {name: l, type: linear, in: 3, out: 2}\nloss: mse\n",
                "m.yaml");
        },
        {"m.yaml:3:19", "only cross_entropy"});
    // ignore_index means nothing to mse (PyTorch's mse_loss has none): refused at the key, not ignored
    require_input_error(
        [] {
            load_model_text(
                "batch:\n  input: [4, 3]\nmodules:\n  - {name: l, type: linear, in: 3, out: 2}\n"
                "loss: mse\nignore_index: 0\n",
                "m.yaml");
        },
        {"m.yaml:6:15", "ignore_index is cross_entropy's (the loss is mse)"});
    require_input_error([] { sft("", "{prompt: [5, 2]}"); }, {"'prompt' [5, 2] needs 0 <= lo <= hi"});
    require_input_error([] { sft("init: {std: 0.02, std_by_param: {'nothing.*': 0.1}}"); },
                        {"std_by_param 'nothing.*' matches no"});
    CHECK(plan_error("mesh: {dp: 2}\nloss_normalization: global\n").find("p.yaml:2:21") != std::string::npos);
    const Plan p = load_plan_text("mesh: {dp: 2}\nloss_normalization: global_tokens\n", "p.yaml");
    CHECK(p.normalization(sft()) == LossNormalization::global_tokens);
    CHECK(p.gradient_reduction(sft()) == ReduceOp::sum);
    CHECK(load_plan_text("mesh: {dp: 2}\n", "p.yaml").gradient_reduction(sft()) == ReduceOp::avg);
}

TEST_CASE("transformers' init: weights N(0, std), biases 0, a pattern's own std", "[cpu]") {
    const Model m = load_model_text(R"(batch:
  input: {tokens: [2, 4], vocab: 64}
modules:
  - {name: emb, type: embedding, vocab: 64, dim: 256}
  - {name: proj, type: linear, in: 256, out: 256}
  - {name: head, type: linear, in: 256, out: 64}
init: {std: 0.02, std_by_param: {"proj.weight": 0.005}}
loss: cross_entropy
)",
                                    "m.yaml");
    auto stddev = [](const Tensor& t) {
        double s = 0;
        for (double v : t.to_doubles()) s += v * v;
        return std::sqrt(s / static_cast<double>(t.numel()));
    };
    for (const auto& [name, p] : m.named_parameters()) {
        INFO(name);
        if (name.find("bias") != std::string::npos) {
            for (double v : p->value.to_doubles()) CHECK(v == 0.0);
        } else {
            CHECK(stddev(p->value) == Approx(name == "proj.weight" ? 0.005 : 0.02).epsilon(0.05));
        }
    }
}

TEST_CASE("global_tokens passes and mean_per_call fails with the cause on masked targets", "[cpu]") {
    for (const char* plan : {"llama_sft_ddp", "llama_sft_fsdp_cp"}) {
        INFO(plan);
        VerifyJob job = shipped_job({"llama_sft", plan, 1, nullptr});
        VerifyReport rep = verify(job, *in_process_launch(Device::cpu, CommOptions{}));
        CHECK(rep.pass);
        job.plans[0].loss_normalization = LossNormalization::mean_per_call;
        rep = verify(job, *in_process_launch(Device::cpu, CommOptions{}));
        CHECK_FALSE(rep.pass);
        bool named = false;
        for (const std::string& n : rep.plans[0].notes)
            named |= n.rfind("cause: ", 0) == 0 && n.find("masked unevenly") != std::string::npos;
        CHECK(named);
    }
}

TEST_CASE("explain says which normalisation a plan runs", "[cpu]") {
    const Plan ddp =
        load_plan_text("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n", "p.yaml");
    const std::string per_call = describe_loss(sft("gradient_accumulation: 2"), ddp);
    CHECK(per_call.find(
              "cross_entropy (ignore_index -100), loss_normalization mean_per_call (the model's)") == 0);
    CHECK(per_call.find("/ 2 microbatches") != std::string::npos);
    CHECK(per_call.find("averages the 2 ranks' gradients") != std::string::npos);
    Plan global = ddp;
    global.loss_normalization = LossNormalization::global_tokens;
    const std::string g = describe_loss(sft(), global);
    CHECK(g.find("loss_normalization global_tokens (the plan's)") != std::string::npos);
    CHECK(g.find("the step's count over 2 ranks x 1 microbatch (one all_reduce)") != std::string::npos);
    CHECK(g.find("sums the ranks' gradients") != std::string::npos);
}

}  // namespace test_loss_normalization
