// A verify's results: per plan, every compared tensor's diff and verdict, the replica checks, the
// first divergence, and the run's counts; how they are judged (compare_runs).
#pragma once

#include <functional>
#include <optional>

#include "verify/run_record.h"

namespace ptool {

struct Plan;

struct TensorReport {
    std::string name;  // golden name: step0.grad.net1.weight
    TensorDiff diff;
    ReplicaState replicas = ReplicaState::sharded;
    bool pass = true;
};

// Where a failing run first left tolerance, in the order things were computed.
struct Divergence {
    int64_t step = 0;
    std::string
        kind;  // "forward" (a module's output), "backward" (its input gradient), "grad", "grad_norm", "param"
    std::string fqn;  // the module's (forward, backward) or the parameter's (grad, param); "" for grad_norm
    TensorDiff diff;
    std::string before;  // what agreed just before it ("the step's input" at the start)
    std::string text;    // "first divergence: step 0 ..."
};

struct PlanReport {
    std::string plan_path;  // or, for a golden case's comparisons, "parallel vs reference", ...
    std::vector<std::string> warnings;
    std::vector<TensorReport> tensors;
    int passed = 0, failed = 0;
    bool pass = true;
    std::string localisation;  // "first divergence: ..." when something failed (divergence->text)
    std::optional<Divergence> divergence;
    std::vector<std::string> notes;  // replica invariants; the expected causes of a mismatch
    RunRecord run;                   // counts, time, world size
    Tolerance tol;
    std::vector<std::pair<std::string, int>> mesh;  // the plan's mesh dims (name, size), outermost first
};

struct VerifyReport {
    DType dtype = DType::float32;  // the model's, as run
    std::vector<PlanReport> plans;
    RunRecord
        reference;  // the reference run (of the last plan's step count; whole with VerifyJob::keep_reference)
    double reference_seconds = 0;
    bool reference_beside = false;  // recorded beside the parallel run (VerifyOptions::reference_beside)
    bool pass = true;
};

// A golden case's verdict. refused: the case could not be run as asked (its file, model or plan
// bad, or the command's options not for it: float8 in float16); the replay goes on to the next case
// and the command exits 2 once every case has run.
enum class Verdict { pass, fail, stale, updated, refused };
const char* verdict_name(Verdict v);  // "PASS", "FAIL", "STALE", "UPDATED", "REFUSED"

// Compares a parallel run with the reference, tensor by tensor (rank 0 side): the tolerance, the
// low-precision module rule, replica states, the state after construction, and where a failure
// first appeared.
PlanReport compare_runs(const RunRecord& reference, const RunRecord& parallel, const Plan& plan,
                        const Tolerance& tol);

// The update rule (optimizer-aware verdicts). An adaptive optimizer divides by the gradient's
// running RMS: AdamW's first update is lr * g / (|g| + eps), so where |g| is near eps (a bias whose
// exact gradient is zero, a weight few rows touch) rounding-sized gradient noise moves the element
// by up to lr either way. A parameter that fails the elementwise rule still passes when every one
// of its gradients so far agreed and `consistent(name)` says its update is the optimizer's own on
// those gradients (the shadow optimizer's parameter, StepRecord::vs_shadow). A wrong update (a
// stale or skipped step, a wrong shard) is inconsistent and fails; a wrong gradient fails first.
// The module rules, over a report's step{k}.grad.* (and, without mixed precision, param.*) tensors
// grouped by module (the names that differ only in their last atom): in low precision a tensor that
// fails alone passes when its error is within Tolerance::rel_fro of its module's norm; in float32/64
// a gradient that passes elementwise fails when its error exceeds Tolerance::systematic of it (or of
// its own norm, where that is above the module's rounding level: a bias beside its weight).
void judge_by_module(PlanReport& rep, const Tolerance& tol);

// The numbers a report's heat map draws (`verify --csv`, `--report`): per step, each module's
// forward output and input gradient (localisation's events; with `events` on) and each
// parameter's gradient and update, with their diffs, in computation order.
struct ErrorCell {
    int64_t step = 0;
    std::string kind;    // forward, backward, grad, param (the update), output, loss, grad_norm, buffer
    std::string module;  // the module's fqn ("" the root); for grad/param/buffer the owner of the tensor
    std::string tensor;  // the golden name for recorded tensors, "" for events
    TensorDiff diff;
    bool pass = true;
};
std::vector<ErrorCell> error_cells(const PlanReport& rep);

void apply_update_rule(PlanReport& rep, const std::function<bool(const std::string& param_key)>& consistent);

// The loss of the outputs themselves (Tolerance::loss_of_outputs): a step's loss that failed its
// own rule passes where |a - e| <= atol + rtol |e| + |d| + eps m: d its step's outputs' difference
// made into the loss (the output row's TensorDiff::signed_err, over its elements for a mean), m
// their expected magnitude made so (expected_l1), eps the compute dtype's (Tolerance::output_eps):
// each side rounds its microbatches' losses in it (a partial of magnitude up to m, half an eps each). A mean
// of signed outputs that cancel parts from the expected one by the outputs' difference and those
// roundings, which |e| alone did not allow; a loss its outputs do not account for by more than
// eps m (combined wrong over ranks or microbatches) still fails. Only where the step's output row
// was compared and passed (wrong outputs do not excuse the loss they make); `expected` finds the
// expected side's loss by name.
void judge_loss_by_outputs(PlanReport& rep, const Tolerance& tol,
                           const std::function<const Tensor*(const std::string&)>& expected);

// A verify's comparison is of finite runs: a tensor with a NaN or an infinity on either side fails,
// whatever the other side holds (a NaN from the first step on both sides is not an agreement, and
// would pass every injected bug too), and a note names the first such tensor and the side(s) that
// hold it ("the reference (12 elements) and the parallel run (12)"). Comparing a file with itself
// (`golden diff`) keeps TensorDiff's own rule: the same NaN at the same place is equal.
void fail_nonfinite(PlanReport& rep, const std::string& actual_side, const std::string& expected_side);
std::string nonfinite_sides(const TensorDiff& d, const std::string& actual_side,
                            const std::string& expected_side);

// The first divergence, in the order things were computed: per step, every module's output
// (forward) and input gradient (backward), then the parameters' gradients, then their updates (the
// step's parameters). Names the first that leaves tolerance, or holds a NaN or inf on either side
// ("first non-finite value: ..."), and what agreed just before it; "" if nothing does. `rep`
// holds the step tensors' verdicts (after the update rule).
std::optional<Divergence> localise(const RunRecord& ref, const RunRecord& par, const Tolerance& tol,
                                   const PlanReport& rep);

}  // namespace ptool
