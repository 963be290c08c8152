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
#include "train/schedule.h"

namespace ptool {

using StepTensors = std::vector<std::pair<std::string, Tensor>>;

// `step0(change)`: the recorded tensors of step 0 of the plan's run with its schedule changed by
// `change`. Returns "W3@1 (stage 1, microbatch 3, on pp rank 1)" for the culprit, "stage 1's Ws"
// where unsplitting the stage changes its gradients and no single microbatch's does, or nothing
// where unsplitting no stage changes anything (the split is not the cause).
std::optional<std::string> localise_weight(
    const Schedule& schedule, const std::function<StepTensors(const std::function<void(Schedule&)>&)>& step0);

}  // namespace ptool
