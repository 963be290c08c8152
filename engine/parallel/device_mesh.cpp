#include "parallel/device_mesh.h"

namespace ptool {

std::vector<int> DeviceMesh::coords_of(int rank, const std::vector<MeshDim>& dims) {
    std::vector<int> c(dims.size());
    for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
        c[d] = rank % dims[d].size;
        rank /= dims[d].size;
    }
    return c;
}

int DeviceMesh::rank_of(const std::vector<int>& coords, const std::vector<MeshDim>& dims) {
    int r = 0;
    for (size_t d = 0; d < dims.size(); ++d) r = r * dims[d].size + coords[d];
    return r;
}

DeviceMesh::DeviceMesh(std::vector<MeshDim> dims, Communicator& world, std::shared_ptr<CommCounter> counter)
    : dims_(std::move(dims)), world_(world), counter_(std::move(counter)) {
    int product = 1;
    for (const auto& d : dims_) product *= d.size;
    PTOOL_REQUIRE(product == world.size(), "mesh of {} ranks on a world of {}", product, world.size());
    coords_ = coords_of(world.rank(), dims_);
    world_.set_counter(counter_, "world");
    for (int d = 0; d < ndim(); ++d) {
        // color: my position along every other dim; key: my position along d
        std::vector<int> others = coords_;
        others[d] = 0;
        comms_.push_back(world.split_known(rank_of(others, dims_), coords_[d], coords_[d], dims_[d].size));
        comms_.back()->set_counter(counter_, dims_[d].name);
    }
}

Communicator* DeviceMesh::group(const MeshGroup& g) {
    if (g.dims.empty() && g.label.empty()) return nullptr;
    if (g.dims.size() == 1 && g.label == dims_[g.dims[0]].name) return comms_[g.dims[0]].get();
    std::unique_ptr<Communicator>& made = groups_[g.name];
    if (made) return made.get();
    std::vector<int> others = coords_;  // color: my position along the other dims
    int key = 0, size = 1;              // key: my position along g.dims, row-major
    for (int d : g.dims) others[d] = 0, key = key * dims_[d].size + coords_[d], size *= dims_[d].size;
    made = world_.split_known(rank_of(others, dims_), key, key, size);
    made->set_counter(counter_, g.label);
    if (wrap_groups_) made = wrap_groups_(std::move(made));
    return made.get();
}

int DeviceMesh::dim_index(const std::string& name) const {
    for (int d = 0; d < ndim(); ++d)
        if (dims_[d].name == name) return d;
    return -1;
}

void DeviceMesh::wrap(int dim, const Wrapper& wrap) {
    comms_[dim] = wrap(std::move(comms_[dim]));
}

}  // namespace ptool
