#include "verify/loss_causes.h"

#include <algorithm>
#include <numeric>

#include "model/target_mask.h"

namespace ptool {

std::vector<std::vector<int64_t>> valid_target_counts(const Model& model, const Plan& plan,
                                                      const Batch& batch) {
    const int64_t microbatches = plan.accumulation_rounds(model) * plan.microbatches_per_round();
    const int data = plan.dims.data_size();
    const int cp = plan.context_parallel ? plan.dims.size(DimRole::cp) : 1;
    const Tensor& target = batch.target;
    const int64_t rows = target.size(0), mine = rows / microbatches / data;
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(microbatches));
    for (int64_t m = 0; m < microbatches; ++m)
        for (int d = 0; d < data; ++d) {
            const Tensor part = target.narrow(0, m * (rows / microbatches) + d * mine, mine);
            for (int c = 0; c < cp; ++c) {
                Tensor piece = part;
                if (cp > 1) {
                    const ContextShard shard =
                        ContextShard::make(target.size(1), cp, c, plan.context_parallel->load_balance,
                                           plan.context_parallel->rotate, nullptr);
                    piece = shard.take(part, 1);
                }
                counts[static_cast<size_t>(m)].push_back(valid_targets(piece, model.ignore_index));
            }
        }
    return counts;
}

namespace {

// "data ranks 0-3" / "(data, cp) ranks (0, 0), (0, 1), ...": whose counts a list holds
std::string holders(const Plan& plan) {
    const int data = plan.dims.data_size();
    const int cp = plan.context_parallel ? plan.dims.size(DimRole::cp) : 1;
    if (cp == 1) return fmt::format("data ranks 0-{}", data - 1);
    if (data == 1) return fmt::format("cp ranks 0-{}", cp - 1);
    return fmt::format("(data, cp) ranks (0, 0) to ({}, {}), cp fastest", data - 1, cp - 1);
}

std::string counts_text(const std::vector<int64_t>& c) {
    constexpr size_t kShown = 8;
    std::vector<int64_t> shown(c.begin(),
                               c.begin() + static_cast<std::ptrdiff_t>(std::min(c.size(), kShown)));
    return fmt::format("{}{}", fmt::join(shown, ", "),
                       c.size() > kShown ? fmt::format(", ... ({} in all)", c.size()) : "");
}

}  // namespace

std::vector<Diagnostic> loss_normalization_causes(const Model& model, const Plan& plan,
                                                  const DataSource& data, int64_t steps,
                                                  const SourceLocation& data_where) {
    std::vector<Diagnostic> causes;
    if (model.loss != LossKind::cross_entropy) return causes;
    const int64_t checked = data.varies_per_step() ? steps : 1;
    const bool per_call = plan.normalization(model) == LossNormalization::mean_per_call;
    const int64_t pieces = static_cast<int64_t>(plan.dims.data_size()) *
                           (plan.context_parallel ? plan.dims.size(DimRole::cp) : 1);
    for (int64_t k = 0; k < checked; ++k) {
        const Batch b = data.batch(k);
        const auto counts = valid_target_counts(model, plan, b);
        std::vector<int64_t> in_microbatch;  // each microbatch's valid targets over its pieces
        for (const auto& m : counts) in_microbatch.push_back(std::accumulate(m.begin(), m.end(), int64_t{0}));
        const int64_t total = std::accumulate(in_microbatch.begin(), in_microbatch.end(), int64_t{0});
        if (total == 0)
            throw InputError(data_where,
                             fmt::format("step {}'s batch has no valid target (every one is the ignore_index "
                                         "{}): its loss is a mean over nothing (NaN in PyTorch), so there is "
                                         "nothing to train on or compare",
                                         k, model.ignore_index));
        if (!per_call) continue;
        for (size_t m = 0; m < in_microbatch.size(); ++m)
            if (in_microbatch[m] == 0)
                throw InputError(
                    data_where,
                    fmt::format(
                        "step {}'s microbatch {} has no valid target (every one is the ignore_index {}): "
                        "under loss_normalization: mean_per_call its cross_entropy is 0 / 0 = NaN, as "
                        "PyTorch's (whose gradients are then zero), so the step's loss is NaN and "
                        "neither run's can be compared (fix: loss_normalization: global_tokens, which "
                        "adds nothing for it as torchtitan's global_valid_tokens does, or a batch "
                        "whose every microbatch holds a valid target)",
                        k, m, model.ignore_index));
        if (pieces == 1 || !causes.empty()) continue;
        for (size_t m = 0; m < counts.size(); ++m) {
            const auto& c = counts[m];
            if (std::all_of(c.begin(), c.end(), [&](int64_t n) { return n == c[0]; })) continue;
            const int64_t sum = in_microbatch[m];
            const bool empty = std::find(c.begin(), c.end(), 0) != c.end();
            causes.push_back(
                {plan.normalization_where(model),
                 fmt::format(
                     "loss_normalization: mean_per_call with targets masked unevenly: step {}'s "
                     "microbatch {} holds {} valid targets on {} ({} in all); each rank's "
                     "cross_entropy is the mean over its own and data parallel averages the means, so "
                     "the gradients are not the one-device mean over the {} and the run trains "
                     "another model{} (fix: loss_normalization: global_tokens, the step's sum over "
                     "the valid targets of every rank divided by their count, as torchtitan's "
                     "global_valid_tokens and transformers' num_items_in_batch)",
                     k, m, counts_text(c), holders(plan), sum, sum,
                     empty
                         ? "; a rank with none has a NaN loss (0 / 0, PyTorch's mean over nothing) and zero "
                           "gradients"
                         : "")});
            break;
        }
    }
    return causes;
}

SourceLocation targets_where(const Model& model, const RunInputs& in) {
    return in.data             ? SourceLocation{in.data_path, 0, 0}
           : model.target_mask ? model.target_mask_where
                               : SourceLocation{model.path, 0, 0};
}

void require_valid_targets(const Model& model, const Plan& plan, const RunInputs& in, int64_t steps) {
    if (model.loss != LossKind::cross_entropy || !model.target) return;
    const bool drawn_valid = !in.data && !model.target_mask &&
                             !(model.ignore_index >= 0 && model.ignore_index < model.target->range);
    if (drawn_valid) return;  // generated ids in [0, range), none masked: every target is valid
    const DataSource data(model, in.data, in.data_path);
    loss_normalization_causes(model, plan, data, steps, targets_where(model, in));
}

}  // namespace ptool
