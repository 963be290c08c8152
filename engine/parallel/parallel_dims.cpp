#include "parallel/parallel_dims.h"

#include <algorithm>

namespace ptool {

const char* dim_role_name(DimRole r) {
    switch (r) {
        case DimRole::pp:
            return "pp";
        case DimRole::dp_replicate:
            return "dp_replicate";
        case DimRole::dp_shard:
            return "dp_shard";
        case DimRole::cp:
            return "cp";
        case DimRole::tp:
            return "tp";
        case DimRole::ep:
            return "ep";
    }
    return "?";
}

bool is_data_role(DimRole r) {
    return r == DimRole::dp_replicate || r == DimRole::dp_shard;
}

ParallelDims::ParallelDims(std::vector<MeshDim> mesh, std::vector<std::optional<DimRole>> roles)
    : mesh_(std::move(mesh)), roles_(std::move(roles)) {
    PTOOL_REQUIRE(roles_.size() == mesh_.size(), "{} roles for a mesh of {} dims", roles_.size(),
                  mesh_.size());
    for (int d = 0; d < ndim(); ++d) {
        if (!roles_[d]) continue;
        int& at = index_[static_cast<int>(*roles_[d])];
        PTOOL_REQUIRE(at < 0, "role {} on mesh dims {} and {}", dim_role_name(*roles_[d]), at, d);
        at = d;
        if (is_data_role(*roles_[d])) data_dims_.push_back(d);
    }
}

int ParallelDims::world_size() const {
    int n = 1;
    for (const MeshDim& d : mesh_) n *= d.size;
    return n;
}

const std::string& ParallelDims::name(DimRole r) const {
    static const std::string none;
    return has(r) ? mesh_[index(r)].name : none;
}

int ParallelDims::data_size() const {
    int n = 1;
    for (int d : data_dims_) n *= mesh_[d].size;
    return n;
}

bool ParallelDims::is_data_dim(int mesh_dim) const {
    return roles_[mesh_dim] && is_data_role(*roles_[mesh_dim]);
}

namespace {

// The dims' names joined by '+': what a group over several dims counts its collectives under
std::string joined_names(const std::vector<MeshDim>& mesh, const std::vector<int>& dims) {
    std::string out;
    for (int d : dims) out += (out.empty() ? "" : "+") + mesh[d].name;
    return out;
}

std::vector<int> with_roles(const ParallelDims& p, std::initializer_list<DimRole> roles) {
    std::vector<int> out;
    for (int d = 0; d < p.ndim(); ++d)
        if (p.role(d) && std::find(roles.begin(), roles.end(), *p.role(d)) != roles.end()) out.push_back(d);
    return out;
}

struct GroupRow {
    GroupName name;
    const char* text;
    std::vector<int> (*dims)(const ParallelDims&);
    const char* label;  // null: the dims' names joined by '+'
};

// The run's combined groups: one row each (their dims in mesh order but dp_shard_cp's, whose
// flattened ranks run over the shard dim first, as fully_shard's shards nest).
const GroupRow group_table[kGroupNames] = {
    {GroupName::batch, "batch", [](const ParallelDims& p) { return p.data_dims(); }, nullptr},
    {GroupName::tokens, "tokens",
     [](const ParallelDims& p) {
         return with_roles(p, {DimRole::dp_replicate, DimRole::dp_shard, DimRole::cp});
     },
     nullptr},
    {GroupName::expert_replicas, "expert_replicas",
     [](const ParallelDims& p) {
         std::vector<int> out = p.data_dims();  // ep borrows a data dim
         std::erase(out, p.index(DimRole::ep));
         return out;
     },
     nullptr},
    {GroupName::dp_shard_cp, "dp_shard_cp",
     [](const ParallelDims& p) {
         return p.cp_shards_params() ? std::vector<int>{p.shard_dim(), p.index(DimRole::cp)}
                                     : std::vector<int>{};
     },
     nullptr},
    {GroupName::stage, "stage",
     [](const ParallelDims& p) {
         std::vector<int> out;
         for (int d = 0; d < p.ndim(); ++d)
             if (d != p.index(DimRole::pp)) out.push_back(d);
         return out;
     },
     "stage"},
};

}  // namespace

const char* group_name(GroupName g) {
    return group_table[static_cast<int>(g)].text;
}

MeshGroup ParallelDims::group(GroupName name) const {
    const GroupRow& row = group_table[static_cast<int>(name)];
    PTOOL_REQUIRE(row.name == name, "group table out of order at {}", row.text);
    MeshGroup g{row.text, row.dims(*this), ""};
    g.label = row.label ? row.label : joined_names(mesh_, g.dims);
    return g;
}

std::vector<int> ParallelDims::counted_dims(const std::string& label) const {
    if (label == "world") {
        std::vector<int> all(mesh_.size());
        for (int d = 0; d < ndim(); ++d) all[d] = d;
        return all;
    }
    for (int d = 0; d < ndim(); ++d)
        if (mesh_[d].name == label) return {d};
    for (const GroupRow& row : group_table)
        if (const MeshGroup g = group(row.name); !g.dims.empty() && g.label == label) return g.dims;
    return {};
}

std::vector<int> ParallelDims::param_nesting() const {
    std::vector<int> out;
    if (has(DimRole::tp)) out.push_back(index(DimRole::tp));
    out.insert(out.end(), data_dims_.begin(), data_dims_.end());  // fully_shard: the tp piece's rows
    if (cp_shards_params_) out.push_back(index(DimRole::cp));     // and those rows over cp
    return out;
}

}  // namespace ptool
