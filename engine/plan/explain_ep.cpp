#include "model/routed_experts.h"
#include "plan/explain.h"

namespace ptool {

void explain_expert_parallel(const Model& model, const Plan& plan, Explanation& ex,
                             const std::function<Shape(const Parameter*, int tp_rank)>& tp_local) {
    const ExpertParallelResolution& ep = ex.resolution.ep;
    const int64_t es = static_cast<int64_t>(dtype_size(plan.compute_dtype(model.dtype)));
    const int cp = plan.context_parallel ? plan.dims.size(DimRole::cp) : 1;
    const int64_t microbatches = plan.accumulation_rounds(model) * plan.microbatches_per_round();
    std::vector<CommCost> forward, backward;
    // the balancing loss's statistics (each expert's count and score sum, and the tokens: float64),
    // summed over the ranks whose tokens differ, per moe call (again where it is recomputed)
    if (plan.dims.data_size() * cp > 1)
        for (const CallLayout& c : ex.resolution.layouts.calls)
            if (const RoutedExperts* moe = c.module->routed_experts(); moe && moe->aux_loss_coef() > 0) {
                const CommCost cc{Collective::all_reduce, (2 * moe->experts() + 1) * 8, c.fqn,
                                  Phase::forward};
                forward.push_back(cc);
                if (recomputed_in_backward(ex.resolution, c.fqn))
                    backward.push_back({cc.op, cc.bytes, cc.module, Phase::backward});
            }
    if (!ep.active || ep.size < 2) {
        for (int64_t m = 0; m < microbatches; ++m) {
            ex.step_comm.insert(ex.step_comm.end(), forward.begin(), forward.end());
            ex.step_comm.insert(ex.step_comm.end(), backward.begin(), backward.end());
        }
        return;
    }
    for (const CallLayout& c : ex.resolution.layouts.calls) {
        const RoutedExperts* moe = c.module->routed_experts();
        if (!moe) continue;
        const RouterOptions& r = moe->router_options();
        const int64_t dim = moe->token_dim(), per_rank = r.experts / ep.size;
        const int64_t tokens = numel_of(c.in.global) / dim / cp;  // this rank's, one microbatch
        const int64_t rows = tokens * r.top_k * dim * es;         // its slots' rows, out and back
        ex.expert_parallel.push_back(fmt::format(
            "moe '{}': {} experts, {} per rank (ep rank k owns experts {}k .. {}k+{}); each rank sends "
            "its {} tokens x top_{} = {} rows and receives as many (balanced routing)",
            c.fqn, r.experts, per_rank, per_rank, per_rank, per_rank - 1, tokens, r.top_k, tokens * r.top_k));
        std::vector<CommCost> f = {{Collective::all_to_all, r.experts * 8, c.fqn, Phase::forward},
                                   {Collective::all_to_all, rows, c.fqn, Phase::forward},
                                   {Collective::all_to_all, rows, c.fqn, Phase::forward}};
        forward.insert(forward.end(), f.begin(), f.end());
        if (recomputed_in_backward(ex.resolution, c.fqn))
            for (CommCost cc : f) cc.phase = Phase::backward, backward.push_back(cc);
        backward.push_back({Collective::all_to_all, rows, c.fqn, Phase::backward});
        backward.push_back({Collective::all_to_all, rows, c.fqn, Phase::backward});
    }
    for (int64_t m = 0; m < microbatches; ++m) {
        ex.step_comm.insert(ex.step_comm.end(), forward.begin(), forward.end());
        ex.step_comm.insert(ex.step_comm.end(), backward.begin(), backward.end());
    }
    // after backward: each owned expert's gradient averaged over its replicas (the other data dims;
    // but dp_shard where fully_shard shards the experts over it, its reduce_scatter's)
    const bool sharded = ex.resolution.dp.experts_sharded;
    const int shard =
        sharded ? plan.dims.size(DimRole::dp_shard) * (plan.dims.cp_shards_params() ? cp : 1) : 1;
    const int replicas = plan.dims.data_size() / ep.size / (sharded ? plan.dims.size(DimRole::dp_shard) : 1);
    if (replicas > 1)
        for (const auto& [name, p] : model.named_parameters())
            if (ep.owner.count(name) && ep.owner.at(name) == 0) {
                const size_t dot = name.rfind('.');
                ex.step_comm.push_back({Collective::all_reduce,
                                        bytes_of(tp_local(p.get(), 0), dtype_size(p->value.dtype())),
                                        name.substr(0, dot), Phase::backward});
            }
    if (sharded)
        ex.expert_parallel.push_back(fmt::format(
            "each owned expert's gradient: reduce_scatter avg over '{}' ({} ranks holding the same "
            "experts: fully_shard's unit of the layer's experts), then / {} (ep)",
            plan.dims.name(DimRole::dp_shard), shard, ep.size));
    else
        ex.expert_parallel.push_back(
            replicas > 1
                ? fmt::format("each owned expert's gradient: / {} (ep), then all_reduce avg over its {} "
                              "replicas (the data dims but '{}')",
                              ep.size, replicas, plan.dims.name(DimRole::ep))
                : fmt::format("each owned expert's gradient: / {} (ep; the data dims are '{}' alone)",
                              ep.size, plan.dims.name(DimRole::ep)));
}

}  // namespace ptool
