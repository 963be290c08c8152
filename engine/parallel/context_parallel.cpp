#include "parallel/context_parallel.h"

#include <map>

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

void check_fsdp_over_cp(const Model& model, const Plan& plan, const Resolution& res) {
    if (!plan.context_parallel || !plan.dims.cp_shards_params()) return;
    const ParallelDims& dims = plan.dims;
    const int shard_dim =
        dims.has(DimRole::dp_shard) ? dims.index(DimRole::dp_shard) : dims.index(DimRole::dp_replicate);
    const int n = dims.mesh()[shard_dim].size * dims.size(DimRole::cp);
    std::map<const Parameter*, Placement> tp;  // each styled parameter's placement on tp
    for (const ResolvedStyle& rs : res.styles)
        for (const ParamPlacement& pp : rs.entry->style.style->params(*rs.module))
            if (ParamPtr p = rs.module->param(pp.param)) tp.emplace(p.get(), pp.placement);
    std::map<std::string, const Parameter*> by_name;
    for (const auto& [name, p] : model.named_parameters()) by_name[name] = p.get();
    for (const FsdpUnitSpec& u : res.dp.units)
        for (const std::string& name : u.params) {
            const Parameter* p = by_name.at(name);
            const Shape& global = p->value.shape();
            if (global.empty()) continue;
            const auto it = tp.find(p);
            for (int r = 0; r < res.tp; ++r) {
                const int64_t rows =
                    it == tp.end() ? global[0] : local_shape(global, it->second, res.tp, r)[0];
                if (rows % n != 0)
                    throw InputError(
                        plan.context_parallel->where,
                        fmt::format("fully_shard over '{}' x '{}' ({} ranks, as torchtitan's dp_shard_cp): "
                                    "parameter '{}' has {} rows{}, which do not cut evenly",
                                    dims.mesh()[shard_dim].name, dims.name(DimRole::cp), n, name, rows,
                                    res.tp > 1 ? fmt::format(" on tp rank {}", r) : ""));
            }
        }
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
