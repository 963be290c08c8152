#include "parallel/context_parallel.h"

#include "comm/comm_stats.h"
#include "parallel/parallelize.h"

namespace ptool {

void check_context_parallel(const Model& model, const Plan& plan) {
    if (!plan.context_parallel) return;
    const ContextParallelSpec& s = *plan.context_parallel;
    const int cp = plan.dims.size(DimRole::cp);
    const Shape& in = model.input.shape;
    // a sequence: token ids [rows, seq, ...], or float activations [rows, seq, features, ...]
    if (in.size() < (model.input.ids ? 2u : 3u) || model.output_shape.size() < 2 ||
        model.output_shape[1] != in[1])
        throw InputError(s.where,
                         fmt::format("context_parallel splits the sequence (dim 1) of the batch and of every "
                                     "activation; this model's input is {} and its output {}",
                                     shape_str(in), shape_str(model.output_shape)));
    const int64_t pieces = ContextShard::pieces(cp, s.load_balance);
    if (in[1] % pieces != 0)
        throw InputError(
            s.where, fmt::format("the sequence of {} tokens does not cut into {} equal chunks ({}cp = {})",
                                 in[1], pieces, s.load_balance ? "load_balance: 2 x " : "", cp));
}

ContextShard context_shard(const Plan& plan, int64_t seq, Communicator& cp) {
    const bool balance = plan.context_parallel && plan.context_parallel->load_balance;
    const RotateMethod rotate =
        plan.context_parallel ? plan.context_parallel->rotate : RotateMethod::allgather;
    return ContextShard::make(seq, cp.size(), cp.rank(), balance, rotate, &cp);
}

void sync_context_gradients(const std::vector<std::pair<std::string, ParamPtr>>& params, ReduceOp op,
                            Communicator& cp, const std::function<bool(const Parameter*)>& reduced) {
    if (cp.size() == 1) return;
    for (const auto& [name, p] : params) {
        if (!p->grad.defined() || p->grad.numel() == 0 || reduced(p.get())) continue;
        const size_t dot = name.rfind('.');  // counted under the parameter's module
        CommScope scope(cp.counter().get(), dot == std::string::npos ? "" : name.substr(0, dot),
                        {CommSiteKind::context_grads});
        cp.all_reduce(p->grad, op);
    }
}

}  // namespace ptool
