#include <algorithm>
#include <map>

#include "plan/explain.h"

namespace ptool {
namespace {

// What the data-parallel explanation's steps share: the parameters by name (their TP-local shapes
// on tp rank 0, as DDP sees them), the dtypes the collectives carry, and the step's collectives as
// each step finds them.
struct DpCosts {
    const Model& model;
    const Plan& plan;
    Explanation& ex;
    const std::function<Shape(const Parameter*, int tp_rank)>& tp_local;
    std::map<std::string, const Parameter*> by_name;
    // mixed precision: fully_shard gathers param_dtype and reduce_scatters reduce_dtype; DDP's buckets hold
    // reduce_dtype
    DType gathered, reduced;
    std::vector<CommCost> forward, backward;
    std::vector<CommCost> sync;     // once per step, after the last microbatch (DDP's no_sync before it)
    std::vector<CommCost> gathers;  // ZeRO: after the optimizer step, the updated shards

    DpCosts(const Model& m, const Plan& p, Explanation& e,
            const std::function<Shape(const Parameter*, int tp_rank)>& local)
        : model(m),
          plan(p),
          ex(e),
          tp_local(local),
          gathered(p.compute_dtype(m.dtype)),
          reduced(p.mixed_precision ? p.mixed_precision->reduce_dtype : m.dtype) {
        for (const auto& [name, q] : m.named_parameters()) by_name[name] = q.get();
    }
    Shape local(const std::string& name) const { return tp_local(by_name.at(name), 0); }
    int64_t local_bytes(const std::string& name) const {  // on tp rank 0, as DDP sees it
        const Parameter* p = by_name.at(name);
        return bytes_of(tp_local(p, 0), dtype_size(plan.mixed_precision ? reduced : p->value.dtype()));
    }
    // a module under activation checkpointing runs its forward again in backward: its unit's
    // all_gather and SyncBatchNorm's too
    bool recomputed(const std::string& fqn) const {
        for (const Module* c : ex.resolution.checkpointing.checkpointed)
            if (c->fqn().empty() || fqn == c->fqn() || fqn.rfind(c->fqn() + ".", 0) == 0) return true;
        return false;
    }
};

// DDP fills its buckets with the tensors it sees, the TP-local ones (as the run resolves them again
// after tensor parallelism): the buckets again at tp rank 0's sizes, in registration order
void rebucket_tp_local(DpCosts& c, DataParallelResolution& dp, const DataParallelSpec& spec) {
    const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(spec.bucket_cap_mb * 1024 * 1024));
    for (auto& replica : dp.replicas) {
        std::vector<std::pair<std::string, int64_t>> order;
        for (auto b = replica.buckets.rbegin(); b != replica.buckets.rend(); ++b)
            for (auto q = b->params.rbegin(); q != b->params.rend(); ++q) {
                const Parameter* p = c.by_name.at(*q);
                order.push_back({*q, bytes_of(c.tp_local(p, 0), dtype_size(p->value.dtype()))});
            }
        replica.buckets = assign_buckets(order, cap);
    }
}

// before every forward: one flat broadcast per dtype
void buffer_broadcasts(DpCosts& c, const DataParallelResolution& dp) {
    if (dp.synced_buffers.empty()) return;
    std::map<DType, int64_t> bytes;
    for (const auto& [name, b] : c.model.named_buffers())
        if (dp.synced_buffers.count(name)) bytes[b->value.dtype()] += static_cast<int64_t>(b->value.nbytes());
    for (const auto& [dt, b] : bytes)
        c.forward.push_back(
            {Collective::broadcast, b, dp.replicas.size() == 1 ? dp.replicas[0].root : "", Phase::forward});
}

// fully_shard units: outermost first in forward; reduce_scatter (and the re-gather) in backward
void fully_shard_units(DpCosts& c, const DataParallelResolution& dp, const DataParallelSpec& spec) {
    const Plan& plan = c.plan;
    // fully_shard's group: the dp_shard dim (or the replicate() dim its units share); the batch's is all data
    // dims
    const std::string& shard_dim =
        plan.mesh()[plan.dims.has(DimRole::dp_shard) ? plan.dims.index(DimRole::dp_shard)
                                                     : plan.dims.index(DimRole::dp_replicate)]
            .name;
    // under context parallel fully_shard's group is that dim and cp flattened (dp_shard_cp)
    const bool with_cp = plan.dims.cp_shards_params();
    const int n = plan.dim_size(shard_dim) * (with_cp ? plan.dims.size(DimRole::cp) : 1);
    const std::string shard_group =
        with_cp ? fmt::format("{}' x '{}", shard_dim, plan.dims.name(DimRole::cp)) : shard_dim;
    std::vector<CommCost>& backward = c.backward;
    for (const FsdpUnitSpec& u : dp.units) {
        if (u.params.empty()) continue;
        // a moe layer's experts unit: the experts of ep rank 0 (every ep rank owns as many alike)
        std::vector<std::string> params;
        for (const std::string& name : u.params)
            if (!u.experts || c.ex.resolution.ep.owner.at(name) == 0) params.push_back(name);
        int64_t region = 0;  // elements per rank in the flat buffer
        for (const std::string& name : params) {
            const Shape s = c.local(name);
            const int64_t rows = s.empty() ? 1 : s[0], row = rows ? numel_of(s) / rows : 0;
            region += chunk_of(rows, n, 0).length * row;
        }
        const int64_t gather = n * region * static_cast<int64_t>(dtype_size(c.gathered));
        const int64_t scatter = n * region * static_cast<int64_t>(dtype_size(c.reduced));
        const bool replicated = spec.hybrid() && !u.experts;  // the experts' dp_replicate is ep
        // the unit's hooks are on its module, so a module called more than once a microbatch (a
        // `shared` one) gathers at each call, forward and backward, and reduce-scatters after each
        // call's backward (the partial gradients' shards sum to the whole's)
        int calls = 0;
        for (const CallLayout& call : c.ex.resolution.layouts.calls) calls += call.fqn == u.hooked_on();
        for (int k = 0; k < std::max(1, calls); ++k) {
            c.forward.push_back({Collective::all_gather, gather, u.fqn, Phase::forward});
            // an experts unit's hooks are its moe layer's: gathered again where the layer is recomputed
            if (c.recomputed(u.hooked_on()))
                backward.insert(backward.begin(), {Collective::all_gather, gather, u.fqn, Phase::backward});
            if (!u.fqn.empty())
                backward.insert(backward.begin(), {Collective::all_gather, gather, u.fqn, Phase::backward});
            const auto at = backward.begin() + (u.fqn.empty() ? 0 : 1);
            if (replicated)  // HSDP: the reduced shard is averaged over its replicas
                backward.insert(
                    at, {Collective::all_reduce, region * static_cast<int64_t>(dtype_size(c.reduced)), u.fqn,
                         Phase::backward});
            backward.insert(backward.begin() + (u.fqn.empty() ? 0 : 1),
                            {Collective::reduce_scatter, scatter, u.fqn, Phase::backward});
        }
        region *= static_cast<int64_t>(dtype_size(c.model.dtype));
        c.ex.data_parallel.push_back(fmt::format(
            "fully_shard '{}': {} parameter{}{}, Shard(0) on '{}'{}, {} B per rank in the flat buffer",
            u.fqn.empty() ? "(root)" : u.fqn, params.size(), params.size() == 1 ? "" : "s",
            u.experts ? fmt::format(" (each '{}' rank's own experts)", plan.dims.name(DimRole::ep)) : "",
            shard_group, replicated ? fmt::format(", replicated over '{}'", spec.mesh_dims[0]) : "", region));
    }
}

// SyncBatchNorm: stats all_gather forward, sums all_reduce backward
void sync_batch_norms(DpCosts& c, const DataParallelResolution& dp, const DataParallelSpec& spec) {
    const int batch = dp.size;
    if (!spec.sync_batch_norm || batch <= 1) return;
    const Model& model = c.model;
    for (const std::string& bn : dp.batch_norms)
        for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
            if (fqn != bn) return;
            const int64_t ch = m.param("weight")->value.numel();
            const int64_t sd = model.dtype == DType::float64 ? 8 : 4;
            int calls = 0;  // a shared module runs once per name it has
            for (const auto& [name, p] : model.state_dict()) calls += p == m.param("weight");
            for (int k = 0; k < calls; ++k) {
                c.forward.push_back({Collective::all_gather, batch * 2 * ch * sd, fqn, Phase::forward});
                if (c.recomputed(fqn))
                    c.backward.insert(c.backward.begin(),
                                      {Collective::all_gather, batch * 2 * ch * sd, fqn, Phase::backward});
                c.backward.insert(c.backward.begin(),
                                  {Collective::all_reduce, 2 * ch * sd, fqn, Phase::backward});
            }
        });
}

// replicate()'s buckets: all_reduce after backward, or under ZeRO the bucket's shards stepped
// and all_gathered
void replicate_buckets(DpCosts& c, const DataParallelResolution& dp, const DataParallelSpec& spec) {
    const int d = c.plan.dim_size(spec.mesh_dims[0]);
    for (const auto& replica : dp.replicas) {
        int k = 0;
        for (const BucketSpec& b : replica.buckets) {
            int64_t bytes = 0, numel = 0;
            for (const std::string& name : b.params)
                bytes += c.local_bytes(name), numel += numel_of(c.local(name));
            const std::string root = replica.root.empty() ? "(root)" : replica.root;
            if (dp.zero_stage == 0) {
                c.sync.push_back({Collective::all_reduce, bytes, replica.root, Phase::backward});
                c.ex.data_parallel.push_back(
                    fmt::format("replicate '{}' bucket {}: {} ({}), all_reduce avg after backward", root, k++,
                                fmt::join(b.params, ", "), bytes));
                continue;
            }
            // ZeRO (parallel/zero_optimizer.h): the bucket padded to d equal shards
            const int64_t shard = (numel + d - 1) / d;
            const int64_t padded = d * shard * static_cast<int64_t>(dtype_size(c.reduced));
            c.sync.push_back(dp.zero_stage == 2
                                 ? CommCost{Collective::reduce_scatter, padded, replica.root, Phase::backward}
                                 : CommCost{Collective::all_reduce, bytes, replica.root, Phase::backward});
            c.gathers.push_back({Collective::all_gather,
                                 d * shard * static_cast<int64_t>(dtype_size(c.model.dtype)), replica.root,
                                 Phase::backward});
            c.ex.data_parallel.push_back(fmt::format(
                "replicate '{}' bucket {}: {} ({}), {} avg after backward; ZeRO-{}: each rank steps {} of "
                "its {} "
                "elements, then all_gather",
                root, k++, fmt::join(b.params, ", "), bytes,
                collective_name(dp.zero_stage == 2 ? Collective::reduce_scatter : Collective::all_reduce),
                dp.zero_stage, shard, numel));
        }
    }
}

}  // namespace

void explain_data_parallel(const Model& model, const Plan& plan, Explanation& ex,
                           const std::function<Shape(const Parameter*, int tp_rank)>& tp_local) {
    DataParallelResolution& dp = ex.resolution.dp;
    const DataParallelSpec& spec = *plan.data_parallel;
    DpCosts c(model, plan, ex, tp_local);
    rebucket_tp_local(c, dp, spec);
    buffer_broadcasts(c, dp);
    fully_shard_units(c, dp, spec);
    sync_batch_norms(c, dp, spec);
    replicate_buckets(c, dp, spec);
    if (!dp.ignored_params.empty())
        ex.data_parallel.push_back(
            fmt::format("not synchronised (ignored_modules): {}", fmt::join(dp.ignored_params, ", ")));
    for (int64_t j = 0, n = plan.accumulation_rounds(model); j < n;
         ++j) {  // buffers, units and SyncBatchNorm: every microbatch
        ex.step_comm.insert(ex.step_comm.begin(), c.forward.begin(), c.forward.end());
        ex.step_comm.insert(ex.step_comm.end(), c.backward.begin(), c.backward.end());
    }
    ex.step_comm.insert(ex.step_comm.end(), c.sync.begin(), c.sync.end());
    ex.zero_gathers = std::move(c.gathers);  // after clip_grad_norm's, with the optimizer step
}

}  // namespace ptool
