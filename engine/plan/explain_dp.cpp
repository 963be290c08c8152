#include <algorithm>
#include <map>

#include "plan/explain.h"

namespace ptool {

void explain_data_parallel(const Model& model, const Plan& plan, Explanation& ex,
                           const std::function<Shape(const Parameter*, int tp_rank)>& tp_local) {
    DataParallelResolution& dp = ex.resolution.dp;
    const DataParallelSpec& spec = *plan.data_parallel;
    // fully_shard's group: the dp_shard dim (or the replicate() dim its units share); the batch's is all data
    // dims
    const std::string& shard_dim =
        plan.mesh()[plan.dims.has(DimRole::dp_shard) ? plan.dims.index(DimRole::dp_shard)
                                                     : plan.dims.index(DimRole::dp_replicate)]
            .name;
    // under context parallel fully_shard's group is that dim and cp flattened (dp_shard_cp)
    const bool with_cp = plan.dims.cp_shards_params();
    const int n = plan.dim_size(shard_dim) * (with_cp ? plan.dims.size(DimRole::cp) : 1), batch = dp.size;
    const std::string shard_group =
        with_cp ? fmt::format("{}' x '{}", shard_dim, plan.dims.name(DimRole::cp)) : shard_dim;
    const auto named = model.named_parameters(), buffers = model.named_buffers();
    std::map<std::string, const Parameter*> by_name;
    for (const auto& [name, p] : named) by_name[name] = p.get();
    // mixed precision: fully_shard gathers param_dtype and reduce_scatters reduce_dtype; DDP's buckets hold
    // reduce_dtype
    const DType gathered = plan.compute_dtype(model.dtype);
    const DType reduced = plan.mixed_precision ? plan.mixed_precision->reduce_dtype : model.dtype;
    auto local_bytes = [&](const std::string& name) {  // on tp rank 0, as DDP sees it
        const Parameter* p = by_name.at(name);
        return numel_of(tp_local(p, 0)) *
               static_cast<int64_t>(dtype_size(plan.mixed_precision ? reduced : p->value.dtype()));
    };
    std::vector<CommCost> forward, backward;
    // DDP fills its buckets with the tensors it sees, the TP-local ones (as the run resolves them again
    // after tensor parallelism): the buckets again at tp rank 0's sizes, in registration order
    const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(spec.bucket_cap_mb * 1024 * 1024));
    for (auto& replica : dp.replicas) {
        std::vector<std::pair<std::string, int64_t>> order;
        for (auto b = replica.buckets.rbegin(); b != replica.buckets.rend(); ++b)
            for (auto q = b->params.rbegin(); q != b->params.rend(); ++q) {
                const Parameter* p = by_name.at(*q);
                order.push_back(
                    {*q, numel_of(tp_local(p, 0)) * static_cast<int64_t>(dtype_size(p->value.dtype()))});
            }
        replica.buckets = assign_buckets(order, cap);
    }

    if (!dp.synced_buffers.empty()) {  // before every forward: one flat broadcast per dtype
        std::map<DType, int64_t> bytes;
        for (const auto& [name, b] : buffers)
            if (dp.synced_buffers.count(name))
                bytes[b->value.dtype()] += static_cast<int64_t>(b->value.nbytes());
        for (const auto& [dt, b] : bytes)
            forward.push_back(
                {"broadcast", b, dp.replicas.size() == 1 ? dp.replicas[0].root : "", Phase::forward});
    }
    // a module under activation checkpointing runs its forward again in backward: its unit's
    // all_gather and SyncBatchNorm's too
    auto recomputed = [&](const std::string& fqn) {
        for (const Module* c : ex.resolution.checkpointing.checkpointed)
            if (c->fqn().empty() || fqn == c->fqn() || fqn.rfind(c->fqn() + ".", 0) == 0) return true;
        return false;
    };
    // fully_shard units: outermost first in forward; reduce_scatter (and the re-gather) in backward
    for (const FsdpUnitSpec& u : dp.units) {
        if (u.params.empty()) continue;
        // a moe layer's experts unit: the experts of ep rank 0 (every ep rank owns as many alike)
        std::vector<std::string> params;
        for (const std::string& name : u.params)
            if (!u.experts || ex.resolution.ep.owner.at(name) == 0) params.push_back(name);
        int64_t region = 0;  // elements per rank in the flat buffer
        for (const std::string& name : params) {
            const Shape s = tp_local(by_name.at(name), 0);
            const int64_t rows = s.empty() ? 1 : s[0], row = rows ? numel_of(s) / rows : 0;
            region += chunk_of(rows, n, 0).length * row;
        }
        const int64_t gather = n * region * static_cast<int64_t>(dtype_size(gathered));
        const int64_t scatter = n * region * static_cast<int64_t>(dtype_size(reduced));
        forward.push_back({"all_gather", gather, u.fqn, Phase::forward});
        // an experts unit's hooks are its moe layer's: gathered again where the layer is recomputed
        if (recomputed(u.hooked_on()))
            backward.insert(backward.begin(), {"all_gather", gather, u.fqn, Phase::backward});
        if (!u.fqn.empty()) backward.insert(backward.begin(), {"all_gather", gather, u.fqn, Phase::backward});
        const auto at = backward.begin() + (u.fqn.empty() ? 0 : 1);
        const bool replicated = spec.hybrid() && !u.experts;  // the experts' dp_replicate is ep
        if (replicated)  // HSDP: the reduced shard is averaged over its replicas
            backward.insert(at, {"all_reduce", region * static_cast<int64_t>(dtype_size(reduced)), u.fqn,
                                 Phase::backward});
        backward.insert(backward.begin() + (u.fqn.empty() ? 0 : 1),
                        {"reduce_scatter", scatter, u.fqn, Phase::backward});
        region *= static_cast<int64_t>(dtype_size(model.dtype));
        ex.data_parallel.push_back(fmt::format(
            "fully_shard '{}': {} parameter{}{}, Shard(0) on '{}'{}, {} B per rank in the flat buffer",
            u.fqn.empty() ? "(root)" : u.fqn, params.size(), params.size() == 1 ? "" : "s",
            u.experts ? fmt::format(" (each '{}' rank's own experts)", plan.dims.name(DimRole::ep)) : "",
            shard_group, replicated ? fmt::format(", replicated over '{}'", spec.mesh_dims[0]) : "", region));
    }
    if (spec.sync_batch_norm &&
        batch > 1)  // SyncBatchNorm: stats all_gather forward, sums all_reduce backward
        for (const std::string& bn : dp.batch_norms)
            for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
                if (fqn != bn) return;
                const int64_t c = m.param("weight")->value.numel();
                const int64_t sd = model.dtype == DType::float64 ? 8 : 4;
                int calls = 0;  // a shared module runs once per name it has
                for (const auto& [name, p] : model.state_dict()) calls += p == m.param("weight");
                for (int k = 0; k < calls; ++k) {
                    forward.push_back({"all_gather", batch * 2 * c * sd, fqn, Phase::forward});
                    if (recomputed(fqn))
                        backward.insert(backward.begin(),
                                        {"all_gather", batch * 2 * c * sd, fqn, Phase::backward});
                    backward.insert(backward.begin(), {"all_reduce", 2 * c * sd, fqn, Phase::backward});
                }
            });
    std::vector<CommCost> sync;     // once per step, after the last microbatch (DDP's no_sync before it)
    std::vector<CommCost> gathers;  // ZeRO: after the optimizer step, the updated shards
    const int d = plan.dim_size(spec.mesh_dims[0]);
    for (const auto& replica : dp.replicas) {
        int k = 0;
        for (const BucketSpec& b : replica.buckets) {
            int64_t bytes = 0, numel = 0;
            for (const std::string& name : b.params)
                bytes += local_bytes(name), numel += numel_of(tp_local(by_name.at(name), 0));
            const std::string root = replica.root.empty() ? "(root)" : replica.root;
            if (dp.zero_stage == 0) {
                sync.push_back({"all_reduce", bytes, replica.root, Phase::backward});
                ex.data_parallel.push_back(
                    fmt::format("replicate '{}' bucket {}: {} ({}), all_reduce avg after backward", root, k++,
                                fmt::join(b.params, ", "), bytes));
                continue;
            }
            // ZeRO (parallel/zero_optimizer.h): the bucket padded to d equal shards
            const int64_t shard = (numel + d - 1) / d;
            const int64_t padded = d * shard * static_cast<int64_t>(dtype_size(reduced));
            sync.push_back(dp.zero_stage == 2
                               ? CommCost{"reduce_scatter", padded, replica.root, Phase::backward}
                               : CommCost{"all_reduce", bytes, replica.root, Phase::backward});
            gathers.push_back({"all_gather", d * shard * static_cast<int64_t>(dtype_size(model.dtype)),
                               replica.root, Phase::backward});
            ex.data_parallel.push_back(fmt::format(
                "replicate '{}' bucket {}: {} ({}), {} avg after backward; ZeRO-{}: each rank steps {} of "
                "its {} "
                "elements, then all_gather",
                root, k++, fmt::join(b.params, ", "), bytes,
                dp.zero_stage == 2 ? "reduce_scatter" : "all_reduce", dp.zero_stage, shard, numel));
        }
    }
    if (!dp.ignored_params.empty())
        ex.data_parallel.push_back(
            fmt::format("not synchronised (ignored_modules): {}", fmt::join(dp.ignored_params, ", ")));
    for (int64_t j = 0, n = plan.accumulation_rounds(model); j < n;
         ++j) {  // buffers, units and SyncBatchNorm: every microbatch
        ex.step_comm.insert(ex.step_comm.begin(), forward.begin(), forward.end());
        ex.step_comm.insert(ex.step_comm.end(), backward.begin(), backward.end());
    }
    ex.step_comm.insert(ex.step_comm.end(), sync.begin(), sync.end());
    ex.zero_gathers = std::move(gathers);  // after clip_grad_norm's, with the optimizer step
}

}  // namespace ptool
