// Localising a split backward's W (zero_bubble, zbv, dualpipev) when a plan's gradients fail: its
// I and W of one microbatch run as one backward (train/schedule.h unsplit) give the same gradients,
// bit for bit, so a W that computes wrong (skipped, added twice, reading freed activations) is the
// one whose unsplitting alone gives the gradients of the stage's whole unsplit schedule. verify runs
// step 0 again per probe (rank threads; issue 49's "localised to stage, microbatch and action").
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/model.h"
#include "train/schedule.h"
#include "verify/report.h"

namespace ptool {

using StepTensors = std::vector<std::pair<std::string, Tensor>>;
using ScheduleChange = std::function<void(Schedule&)>;
// step0(change): the recorded tensors of step 0 of the plan's run with its schedule changed by
// `change` (empty: as planned).
using StepZero = std::function<StepTensors(const ScheduleChange&)>;

// Returns "W3@1 (stage 1, microbatch 3, on pp rank 1)" for the culprit, "stage 1's Ws" where
// unsplitting the stage changes its gradients and no single microbatch's does, or nothing where
// unsplitting no stage changes anything (the split is not the cause).
std::optional<std::string> localise_weight(const Schedule& schedule, const StepZero& step0);

// What a failed report of `plan` (on `model`) adds to its localisation: "; the split backward's
// W3@1 ..." where the plan splits its backward, its gradients (or their norm) diverged first and
// the probes name a W; "" otherwise, or when a probe cannot run.
std::string split_backward_localisation(const PlanReport& rep, const Plan& plan, const Model& model,
                                        const StepZero& step0);

}  // namespace ptool
