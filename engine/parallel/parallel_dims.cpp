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

std::string ParallelDims::data_label() const {
    std::string out;
    for (int d : data_dims_) out += (out.empty() ? "" : "+") + mesh_[d].name;
    return out;
}

std::vector<int> ParallelDims::label_dims(const std::string& label) const {
    if (label == "world") {
        std::vector<int> all(mesh_.size());
        for (int d = 0; d < ndim(); ++d) all[d] = d;
        return all;
    }
    for (int d = 0; d < ndim(); ++d)
        if (mesh_[d].name == label) return {d};
    if (!data_dims_.empty() && label == data_label()) return data_dims_;
    // a flattened group's: its dims' names joined by '+' (fully_shard over dp_shard x cp: "dp+cp")
    std::vector<int> out;
    for (size_t at = 0; at <= label.size();) {
        const size_t plus = std::min(label.find('+', at), label.size());
        const std::string name = label.substr(at, plus - at);
        int found = -1;
        for (int d = 0; d < ndim(); ++d)
            if (mesh_[d].name == name) found = d;
        if (found < 0) return {};
        out.push_back(found);
        at = plus + 1;
    }
    return out;
}

std::vector<int> ParallelDims::param_nesting() const {
    std::vector<int> out;
    if (has(DimRole::tp)) out.push_back(index(DimRole::tp));
    out.insert(out.end(), data_dims_.begin(), data_dims_.end());  // fully_shard: the tp piece's rows
    if (cp_shards_params_) out.push_back(index(DimRole::cp));     // and those rows over cp
    return out;
}

}  // namespace ptool
