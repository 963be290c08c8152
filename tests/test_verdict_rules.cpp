// verify's verdict rules beyond the elementwise one (verify/report.h): the relative Frobenius bound
// of low precision against a module's tensors, the systematic rule and the scale it judges a
// gradient against, a loss judged with its outputs, and the projection that tells clip_grad_norm's
// common factor apart.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "core/tensor_ops.h"
#include "test_helpers.h"
#include "verify/compare.h"
#include "verify/report.h"

using namespace ptool;

namespace test_verdict_rules {

TEST_CASE("low precision: the relative Frobenius bound passes rounding noise, not a wrong result", "[cpu]") {
    CHECK(Tolerance::for_dtype(DType::float32).rel_fro == 0);  // fp32/fp64: the elementwise rule alone
    const Tolerance tol = Tolerance::for_dtype(DType::bfloat16, 3);
    CHECK(tol.rel_fro == Approx(4 * std::pow(1.03, 3) * 0x1p-7));
    // a rowwise sum of two bf16 partials against the full-precision sum, rounded once: where they
    // cancel, a 1-ULP difference of the partials is infinitely far in relative terms
    const std::vector<double> big = {3.0, -2.5, 1.75, 0.0, 2.0, -1.0, 0.5, 1.25};
    Tensor e = Tensor::from_doubles({8}, DType::bfloat16, big), a = e.clone();
    a.set(3, 0.0078125);  // expected 0: fails torch.testing's rule (atol 1e-5)
    const TensorDiff d = compare_tensors(a, e, tol);
    CHECK(d.headroom > 1);
    CHECK(d.rel_fro ==
          Approx(0.0078125 / std::sqrt(3.0 * 3 + 2.5 * 2.5 + 1.75 * 1.75 + 4 + 1 + 0.25 + 1.5625))
              .epsilon(1e-3));
    CHECK(d.by_frobenius);
    CHECK(d.pass);
    Tolerance elementwise = tol;
    elementwise.rel_fro = 0;  // an explicit --rtol/--atol: the elementwise rule alone
    CHECK_FALSE(compare_tensors(a, e, elementwise).pass);
    Tensor wrong = e.clone();
    for (int64_t i = 0; i < 8; ++i) wrong.set(i, 0.5 * big[i]);  // a gradient 1/dp of the reference's
    const TensorDiff w = compare_tensors(wrong, e, tol);
    CHECK(w.rel_fro == Approx(0.5));
    CHECK_FALSE(w.pass);
}

TEST_CASE("low precision: a gradient zero in exact arithmetic is judged against its module's gradient",
          "[cpu]") {
    // attention's key bias: softmax ignores a shift shared by every key, so its gradient is rounding
    // noise; measured against itself that noise is O(1), against the module's weight gradient it is not
    RunRecord ref, par;
    StepRecord r, p;
    Tensor w = Tensor::from_doubles({2, 2}, DType::bfloat16, {0.5, -0.25, 1.0, 0.75});
    Tensor bias = Tensor::from_doubles({2}, DType::bfloat16, {1e-4, -2e-4});
    Tensor bias_noise = Tensor::from_doubles({2}, DType::bfloat16, {-1e-4, 1e-4});
    r.tensors = {{"step0.grad.attn.k_proj.weight", w}, {"step0.grad.attn.k_proj.bias", bias}};
    p.tensors = {{"step0.grad.attn.k_proj.weight", w.clone()}, {"step0.grad.attn.k_proj.bias", bias_noise}};
    ref.steps.push_back(r);
    par.steps.push_back(p);
    Plan plan;
    Tolerance tol = Tolerance::for_dtype(DType::bfloat16, 4);
    const PlanReport rep = compare_runs(ref, par, plan, tol);
    REQUIRE(rep.tensors.size() == 2);
    CHECK(rep.tensors[1].pass);
    CHECK(rep.tensors[1].diff.by_frobenius);
    CHECK(rep.tensors[1].diff.rel_fro < tol.rel_fro);
    CHECK(rep.pass);
    tol.rel_fro = 0;
    CHECK_FALSE(compare_runs(ref, par, plan, tol).pass);  // elementwise: 3e-4 > atol 1e-5
    par.steps[0].tensors[1].second = Tensor::from_doubles({2}, DType::bfloat16, {0.5, 0.5});  // a real error
    CHECK_FALSE(compare_runs(ref, par, plan, Tolerance::for_dtype(DType::bfloat16, 4)).pass);
}

TEST_CASE(
    "a loss of the outputs themselves is judged with them: their difference and rounding, not |e| alone",
    "[cpu]") {
    // loss: mean of signed bf16 outputs that cancel (mean 0.002, mean |o| 0.99); the parallel run's
    // outputs part by an ULP here and there, its mean by 30 bf16 ULPs of the mean (a pipeline's,
    // measured: 4.58e-4 at 0.003)
    std::vector<double> out(160), moved(160);
    for (size_t i = 0; i < out.size(); ++i) {
        out[i] = (i % 2 ? -1.0 : 1.0) * (0.5 + 0.0625 * (i % 17));
        moved[i] = out[i] + (i % 5 == 0 ? 0.0078125 : 0.0);  // +1 ULP (at [0.5, 1) and above) on a fifth
    }
    const Tensor o = Tensor::from_doubles({16, 10}, DType::bfloat16, out),
                 a = Tensor::from_doubles({16, 10}, DType::bfloat16, moved);
    double mean = 0, mag = 0, shift = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        mean += o.item(i) / 160, mag += std::abs(o.item(i)) / 160, shift += (a.item(i) - o.item(i)) / 160;
    }
    Tolerance tol = Tolerance::for_dtype(DType::bfloat16, 4);
    tol.output_eps = 0x1p-7;  // bf16 compute (tolerance_for sets it)
    // the output's comparison sums a - e exactly where the loss is of the outputs
    CHECK_FALSE(rule_for(tol, "step0.output").signed_sum);
    tol.loss_of_outputs = Tolerance::OutputSum::mean;
    CHECK(rule_for(tol, "step0.output").signed_sum);
    CHECK_FALSE(rule_for(tol, "step0.loss").signed_sum);
    const TensorDiff od = compare_tensors(a, o, rule_for(tol, "step0.output"));
    CHECK(od.signed_err == Approx(shift * 160).epsilon(1e-12));
    CHECK(od.expected_l1 == Approx(mag * 160).epsilon(1e-12));
    CHECK(od.elements == 160);

    const double bound = tol.atol + tol.rtol * std::abs(mean) + std::abs(shift) + 0x1p-7 * mag;
    auto loss_passes = [&](double loss_error, Tolerance t, bool with_output = true) {
        RunRecord ref, par;
        StepRecord r, p;
        r.tensors = {{"step0.loss", Tensor::scalar(mean, DType::float64)}};
        p.tensors = {{"step0.loss", Tensor::scalar(mean + loss_error, DType::float64)}};
        if (with_output) r.tensors.emplace_back("step0.output", o), p.tensors.emplace_back("step0.output", a);
        ref.steps.push_back(r);
        par.steps.push_back(p);
        const PlanReport rep = compare_runs(ref, par, Plan{}, t);
        REQUIRE(rep.tensors[0].name == "step0.loss");
        CHECK(rep.passed + rep.failed == static_cast<int64_t>(rep.tensors.size()));
        return rep.tensors[0].pass;
    };
    Tolerance plain = tol;
    plain.loss_of_outputs = Tolerance::OutputSum::none;
    CHECK_FALSE(loss_passes(4.58e-4, plain));  // by |e| = 0.002 alone (a scalar has no Frobenius rescue)
    CHECK(loss_passes(4.58e-4, tol));
    CHECK(loss_passes(0.98 * bound, tol));
    CHECK_FALSE(loss_passes(1.02 * bound, tol));  // a loss its outputs do not account for
    CHECK_FALSE(loss_passes(-1.02 * bound, tol));
    CHECK_FALSE(loss_passes(4.58e-4, tol, false));  // without the outputs compared: by |e|
    // a sum: the same over the elements, not their mean
    tol.loss_of_outputs = Tolerance::OutputSum::sum;
    CHECK(loss_passes(100 * bound, tol));
    CHECK_FALSE(loss_passes(200 * bound, tol));
}

// The first of `tensors` (name, ||e||, ||a - e||; every element within atol) as the module rules
// leave it.
TensorReport judged_first(const std::vector<std::tuple<std::string, double, double>>& tensors,
                          const Tolerance& tol) {
    PlanReport rep;
    for (const auto& [name, ref, err] : tensors) {
        TensorReport t;
        t.name = name, t.diff.ref_norm = ref, t.diff.err_norm = err, t.replicas = ReplicaState::equal;
        rep.tensors.push_back(t), rep.passed += 1;
    }
    judge_by_module(rep, tol);
    return rep.tensors[0];
}

TEST_CASE("the systematic rule judges a gradient at its block's rounding level against the block's",
          "[cpu]") {
    const Tolerance tol = Tolerance::for_dtype(DType::float32);  // systematic 1024 eps
    REQUIRE(tol.systematic > 0);
    auto report = [&](double q_ref, double q_err) {
        return judged_first({{"step0.grad.b3.q_proj.weight", q_ref, q_err},
                             {"step0.grad.b3.o_proj.weight", 1e-2, 1e-10},
                             {"step0.grad.head.weight", 1e-1, 1e-9}},
                            tol);
    };
    // q's true gradient vanishes (every key alike): what both runs computed is rounding residue of
    // the block's backward, 1e-8 of its norm; two summation orders part by 5% of it
    CHECK(report(2.4e-10, 1.25e-11).pass);
    // the same error in a gradient of the block's scale is beyond rounding: 0.1% of it fails
    const TensorReport real = report(1e-3, 1e-6);
    CHECK_FALSE(real.pass);
    CHECK(real.diff.systematic);
    // and an error of the block's scale in the vanishing gradient still fails
    CHECK_FALSE(report(2.4e-10, 1e-7).pass);
}

TEST_CASE("projection: a tensor scaled by a common factor projects to it, exactly", "[cpu]") {
    Tensor e({64}, DType::float32), a({64}, DType::float32);
    for (int64_t i = 0; i < 64; ++i) {
        e.data<float>()[i] = static_cast<float>(std::cos(0.91 * i) * 1e-3);
        a.data<float>()[i] = e.data<float>()[i] * 1.03f;  // clip_grad_norm's coefficient 3% apart
    }
    Tolerance tol = Tolerance::for_dtype(DType::float32);
    tol.projected = true;
    const TensorDiff d = compare_tensors(a, e, tol);
    CHECK(d.projected);
    CHECK(std::abs(d.projection - 0.03) < 1e-6);
    // what is left past it is rounding: ||a - (1 + s) e|| against ||a - e||
    const double left2 = d.err_norm * d.err_norm - 2 * d.projection * d.projection * d.ref_norm * d.ref_norm +
                         d.projection * d.projection * d.ref_norm * d.ref_norm;
    CHECK(std::sqrt(std::max(0.0, left2)) < 1e-6 * d.ref_norm);  // float32 rounding of 1.03 e
    tol.projected = false;                                       // not asked for: not summed
    CHECK_FALSE(compare_tensors(a, e, tol).projected);
}

TEST_CASE("the systematic rule judges a gradient small beside its module's against its own norm", "[cpu]") {
    const Tolerance tol = Tolerance::for_dtype(DType::float32);  // systematic 1024 eps
    REQUIRE(tol.systematic > 0);
    auto report = [&](double bias_ref, double bias_err) {
        return judged_first({{"step0.grad.b0.k_proj.bias", bias_ref, bias_err},
                             {"step0.grad.b0.k_proj.weight", 3.2e-2, 1e-9},
                             {"step0.grad.head.weight", 1e-1, 1e-9}},
                            tol);
    };
    // a real bias gradient (RoPE's keys: 2.8e-3 beside its weight's 3.2e-2) one rank's 0.1% off:
    // 4.8e-4 of its own norm (llama_sft_ddp, grad_scale), under 1024 eps of its module's
    const TensorReport scaled = report(2.8e-3, 1.35e-6);
    CHECK_FALSE(scaled.pass);
    CHECK(scaled.diff.systematic);
    CHECK(scaled.diff.systematic_own);
    CHECK(std::abs(scaled.diff.rel_fro - 1.35e-6 / 2.8e-3) <= 1e-12);
    // two summation orders of it part by 8e-7 of its norm (measured): that passes
    CHECK(report(2.8e-3, 2.3e-9).pass);
    // a bias whose true gradient vanishes (a key bias without RoPE: softmax ignores it) is the
    // module's rounding residue, 1.6e-8 of its norm, and two runs' residues part by all of it:
    // judged against the module's norm, as before
    CHECK(report(5.3e-10, 1e-9).pass);
    CHECK_FALSE(report(5.3e-10, 1e-5).pass);
}

}  // namespace test_verdict_rules
