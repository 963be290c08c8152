// Data parallelism on the data dims of the mesh (parallel/parallel_dims.h), as PyTorch's
// composable replicate() (DDP) and fully_shard() (FSDP2) run it:
//
//   replicate: parameters and buffers broadcast from dp rank 0 when it is built; buffers again
//     before every forward (broadcast_buffers); after backward the gradients are averaged with one
//     all_reduce per bucket: buckets of bucket_cap_mb filled in reverse registration order (a
//     bucket closes once it reaches the cap, as DDP's compute_bucket_assignment_by_size), flat
//     buffers that the gradients are views of with gradient_as_bucket_view. ignored_modules are
//     not synchronised. BatchNorm keeps local statistics unless sync_batch_norm.
//   fully_shard: see fully_shard.h. replicate() skips the parameters fully_shard manages.
//   HSDP (fully_shard over [replicate, shard] dims): units shard over the dp_shard dim and their
//     reduce_scatter's result is then averaged over the dp_replicate dim (all_reduce), as FSDP2
//     does on a 2-D mesh; the batch splits over both dims flattened.
//
// The resolution (which parameter is synchronised how) is computed from FQNs once, before
// anything runs; every rank then applies it to its own model.
#pragma once

#include <map>
#include <memory>
#include <set>

#include "core/diagnostic.h"
#include "model/model.h"
#include "parallel/fully_shard.h"
#include "parallel/plan.h"
#include "parallel/zero_optimizer.h"

namespace ptool {

// One DDP bucket: parameter FQNs in the order they are packed, and their bytes.
struct BucketSpec {
    std::vector<std::string> params;
    int64_t bytes = 0;
};

// DDP's assignment: walk the parameters in reverse registration order, add each to the open
// bucket, close it once it holds >= cap bytes (so a bucket exceeds the cap by at most its last
// parameter, and a parameter larger than the cap is a bucket of its own).
std::vector<BucketSpec> assign_buckets(const std::vector<std::pair<std::string, int64_t>>& params_and_bytes,
                                       int64_t cap_bytes);

struct DataParallelResolution {
    bool active = false;
    int size = 1;  // ranks over which the batch is split: the data dims' (both, under HSDP)
    // one per replicate() root: its synchronised parameters' buckets
    struct Replica {
        std::string root;
        std::vector<BucketSpec> buckets;
    };
    std::vector<Replica> replicas;
    std::vector<FsdpUnitSpec> units;       // fully_shard units, outermost first
    std::set<std::string> ignored_params;  // FQNs under ignored_modules
    // experts' parameters under expert_parallel: not bucketed, each owned by one rank of the borrowed
    // dim and divided by ep by parallel/expert_parallel.h. Where ep borrows HSDP's dp_replicate,
    // fully_shard also shards them over dp_shard (one unit per moe layer, FsdpUnitSpec::experts):
    // torchtitan's fully_shard of the experts over the ranks that hold the same ones (dp_mod_ep).
    std::set<std::string> expert_params;
    bool experts_sharded = false;
    std::set<std::string> synced_buffers;  // broadcast from dp rank 0
    std::vector<std::string> batch_norms;  // FQNs of the BatchNorm modules
    int zero_stage = 0;                    // data_parallel's zero_stage (parallel/zero_optimizer.h)
    // How the ranks' gradients combine (DDP's buckets, fully_shard's reduce_scatter and HSDP's
    // all_reduce, ZeRO's): averaged, as PyTorch's default, or summed under loss_normalization
    // global_tokens, whose loss is already divided by the step's count over every rank (torchtitan's
    // disable_fsdp_gradient_division, set_gradient_divide_factor(1.0)).
    ReduceOp grad_reduce = ReduceOp::avg;
    // ZeRO: dp rank r updates the shard of rank (r + zero_rotation) mod dp; 0 but under fault injection
    int zero_rotation = 0;
    // FSDP2's float8 all-gather: weights whose precomputed scale is their last gather's (FsdpFloat8);
    // empty but under fault injection
    std::set<std::string> float8_stale_scales;
};

// What DDP's construction broadcasts from dp rank 0, in its order: every replica's bucket
// parameters, then the synchronised buffers.
struct BroadcastState {
    std::string name;
    bool buffer = false;
};
std::vector<BroadcastState> construction_broadcast(const DataParallelResolution& res);

// Errors (exit 2): unknown modules (with did-you-mean), a batch that does not split evenly over
// the dp ranks, nested replicate() roots. Findings that explain an expected mismatch (loss: sum,
// BatchNorm with local statistics, ignored modules) go to `causes`; patterns matching nothing
// to `warnings`.
DataParallelResolution resolve_data_parallel(const Model& model, const Plan& plan,
                                             std::vector<Diagnostic>& warnings,
                                             std::vector<Diagnostic>& causes);

// A weight tied between two modules (`tie:`) in two fully_shard units is an InputError at the plan's
// fully_shard: FSDP2 shards a parameter with the first unit that claims it, and the other unit's
// module would compute on its shard. A `shared` module is one module (its unit gathers it at each
// call). Under a pipeline only `stage_model` is checked (a rank's stages, Run: a weight tied to
// another rank's stage is that rank's own copy); resolve_data_parallel checks the rest.
void check_tied_units(const Model& model, const Plan& plan, const DataParallelResolution& res,
                      bool stage_model = false);

// One rank's data-parallel state, built after tensor parallelism (it shards or replicates the
// TP-local tensors). Its collectives run under the counter's scope: the replicate() root or the
// fully_shard unit as module, and "bucket K" as the site of bucket K's all_reduce (the K-th of its
// root), "buffers" for the buffer broadcasts.
class DataParallel {
public:
    // batch: the group the batch is split over (the data dims flattened): SyncBatchNorm's statistics.
    DataParallel(Model& model, const Plan& plan, const DataParallelResolution& res, DeviceMesh& mesh,
                 Communicator& batch, Backend& be);

    bool ignored(const std::string& param_fqn) const { return res_.ignored_params.count(param_fqn) > 0; }
    // Shard(0) for the parameters fully_shard manages, Replicate otherwise.
    Placement placement(const Parameter* p) const;
    // The mesh dim fully_shard shards on (dp_shard, or a replicate() dim with fully_shard units);
    // under context parallel it shards over that dim and cp flattened (ParallelDims::cp_shards_params).
    int shard_dim() const { return shard_dim_; }

    void before_forward();  // broadcast_buffers: dp rank 0's buffers to every rank
    void after_backward();  // the bucketed gradient all_reduce (fully_shard reduced its own in the hooks)
    // Bytes copied into and out of the buckets per step (0 with gradient_as_bucket_view).
    int64_t bucket_copy_bytes() const { return copy_bytes_; }
    int64_t bucket_allreduce_bytes() const { return allreduce_bytes_; }  // per step
    // torchao's precompute_float8_dynamic_scale_for_fsdp after the optimizer step (FullyShard's).
    void precompute_float8_scales() {
        if (fsdp_) fsdp_->precompute_float8_scales();
    }
    // ZeRO (zero_stage 1 or 2): the sharded optimizer step over the buckets; null for plain DDP
    ZeroOptimizer* zero() const { return zero_.get(); }

private:
    struct Bucket {
        std::string root;
        std::vector<ParamPtr> params;
        std::vector<std::string> names;
        Tensor flat;
    };
    // One flat broadcast from dp rank 0 per dtype. `poison`: a rank other than 0 starts from
    // poison_replica's values of its tensors (floating-point ones written straight into the flat
    // buffer, the copy it makes anyway), so they are its tensors' values wherever the broadcast
    // does not replace them.
    void broadcast_coalesced(const std::vector<ParamPtr>& tensors, bool poison = false);

    const DataParallelResolution& res_;
    Communicator* comm_;  // replicate()'s buckets and buffers: the dp_replicate dim (mode replicate)
    int shard_dim_ = -1;
    std::shared_ptr<CommCounter> counter_;
    Backend& be_;
    bool bucket_view_ = false;
    std::vector<Bucket> buckets_;
    std::vector<ParamPtr> buffers_;  // synced buffers
    std::unique_ptr<FullyShard> fsdp_;
    std::unique_ptr<ZeroOptimizer> zero_;
    int64_t copy_bytes_ = 0, allreduce_bytes_ = 0;
};

// Overwrites a tensor that a broadcast is about to replace with values no correct run produces
// (rank-dependent), so that a broadcast that is skipped or sent from the wrong rank is caught.
void poison_replica(Tensor& t, int rank);
// The same values written to `out` (t's shape and dtype; floating point), t unchanged.
void poison_into(const Tensor& t, int rank, Tensor& out);

}  // namespace ptool
