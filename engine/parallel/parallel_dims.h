// Parallel dimensions as data: which dim of a plan's mesh plays which role, after torchtitan's
// ParallelDims. A role is one way of splitting the training job:
//
//   pp            pipeline: each rank holds a stage (a range of layers; several under an interleaved
//                 schedule); activations go forward and gradients back between stages (train/schedule.h)
//   dp_replicate  data parallel, replicated parameters: DDP's replicate(), or HSDP's outer dim
//   dp_shard      data parallel, sharded parameters: fully_shard() (FSDP2/ZeRO-3), or HSDP's inner dim
//   cp            context parallel: the sequence split over ranks for the whole model (context_parallel)
//   tp            tensor parallel: parallelize_module's styles cut modules' parameters and activations
//   ep            expert parallel: each moe layer's experts split over the ranks of a data dim it
//                 borrows (torchtitan borrows ep from dp_shard x cp); the tokens go to their
//                 experts' ranks and back by all_to_all (parallel/expert_parallel.h)
//
// The plan's sections name the dims they use (tensor_parallel.mesh_dim; data_parallel.mesh_dim, a
// list of two for HSDP); resolve_dims checks in one place that every named dim exists, that no dim
// plays two roles and no role is played twice. A mesh dim that no section names has no role: its
// ranks hold replicas of one run (they must be bitwise equal, and the recorder checks that they are).
//
// The batch's rows are split over the data dims (dp_replicate and dp_shard, flattened in mesh order:
// torchtitan's "dp" mesh); a parameter is cut by tp, then fully_shard cuts the tp piece's rows over
// dp_shard (param_nesting). Code that needs a dim asks for its role: no code outside plan parsing
// spells a dim's name.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/device_mesh.h"

namespace ptool {

enum class DimRole { pp, dp_replicate, dp_shard, cp, tp, ep };

// The groups a run makes over several mesh dims at once, by what they are for (torchtitan's
// ParallelDims.get_mesh("dp_shard_cp")); each is a row of group_table (parallel_dims.cpp):
//
//   batch            the data dims: the batch's rows split over them (torchtitan's "dp")
//   tokens           the data dims and cp: the ranks whose tokens differ (global_tokens' count, a moe
//                    layer's balancing statistics)
//   expert_replicas  the data dims but ep: the ranks that hold the same experts (their gradients'
//                    all_reduce), where fully_shard does not shard them
//   dp_shard_cp      fully_shard's shard dim, then cp: fully_shard under context parallel
//   stage            every dim but pp: a pipeline stage's ranks (verification's, uncounted)
enum class GroupName { batch, tokens, expert_replicas, dp_shard_cp, stage };
inline constexpr int kGroupNames = 5;
const char* group_name(GroupName g);  // "batch", "tokens", ...
inline constexpr int kDimRoles = 6;
const char* dim_role_name(DimRole r);  // "pp", "dp_replicate", ...
bool is_data_role(DimRole r);          // dp_replicate, dp_shard

class ParallelDims {
public:
    ParallelDims() = default;  // no mesh: one device
    // roles[d]: mesh dim d's role, if any (InputError-free: resolve_dims has checked them)
    ParallelDims(std::vector<MeshDim> mesh, std::vector<std::optional<DimRole>> roles);

    const std::vector<MeshDim>& mesh() const { return mesh_; }
    int ndim() const { return static_cast<int>(mesh_.size()); }
    int world_size() const;
    std::optional<DimRole> role(int mesh_dim) const { return roles_[mesh_dim]; }
    int index(DimRole r) const { return index_[static_cast<int>(r)]; }  // -1: the mesh has no such dim
    bool has(DimRole r) const { return index(r) >= 0; }
    int size(DimRole r) const { return has(r) ? mesh_[index(r)].size : 1; }
    const std::string& name(DimRole r) const;  // "" when absent
    // The data dims (dp_replicate, dp_shard) in mesh order: the batch's rows split over their
    // flattened group; its size is the product of theirs (1: none).
    const std::vector<int>& data_dims() const { return data_dims_; }
    int data_size() const;
    bool is_data_dim(int mesh_dim) const;
    // The data dim fully_shard shards on: dp_shard, else dp_replicate (-1: neither).
    int shard_dim() const {
        return has(DimRole::dp_shard) ? index(DimRole::dp_shard) : index(DimRole::dp_replicate);
    }
    // A combined group of the run, declared once here (group_table in parallel_dims.cpp) and built
    // once by the mesh (DeviceMesh::group): its dims and the label it counts its collectives under.
    MeshGroup group(GroupName name) const;
    // The mesh dims of the group whose collectives count under `label`: "world" (every dim), a
    // dim's name, or the label of a combined group above; empty for a label of none of them.
    std::vector<int> counted_dims(const std::string& label) const;
    // The mesh dims that may cut a parameter, in the order they cut it: tp, then the data dims
    // (fully_shard cuts the tp piece's rows over the dim it shards on: dp_shard, or a replicate()
    // dim that also has fully_shard units). A parameter's Placements nest in this order.
    std::vector<int> param_nesting() const;
    // Context parallel under fully_shard: the cp ranks join the shard group for parameters, as
    // torchtitan's dp_shard_cp mesh (fully_shard over dp_shard x cp flattened; the cp dim then
    // cuts a fully_shard parameter's rows after the data dims, and param_nesting lists it last).
    void set_cp_shards_params(bool on) { cp_shards_params_ = on && has(DimRole::cp); }
    // Expert parallel borrows data dim `mesh_dim`: index(ep) names it, its role stays the data one
    // (the batch's rows still split over it; the experts split over it too).
    void set_expert_dim(int mesh_dim) { index_[static_cast<int>(DimRole::ep)] = mesh_dim; }
    bool cp_shards_params() const { return cp_shards_params_; }
    // `--mesh NAME=SIZE`: the same roles on a resized dim
    void resize(int mesh_dim, int size) { mesh_[mesh_dim].size = size; }

private:
    std::vector<MeshDim> mesh_;
    std::vector<std::optional<DimRole>> roles_;
    std::array<int, kDimRoles> index_{-1, -1, -1, -1, -1, -1};
    std::vector<int> data_dims_;
    bool cp_shards_params_ = false;
};

}  // namespace ptool
