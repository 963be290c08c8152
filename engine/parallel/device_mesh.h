// DeviceMesh: ranks laid out row-major over named dims, as torch.distributed's DeviceMesh:
// mesh = arange(world).reshape(sizes). For {dp: 2, tp: 4}, rank 6 is at (dp 1, tp 2); its tp
// group is ranks 4..7 and its dp group ranks 2 and 6. One sub-communicator per dim, made with
// split (MPI_Comm_split, thread groups), each counting its collectives under the dim's name.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ptool {

struct MeshDim {
    std::string name;
    int size = 1;
};

// A group over several dims together, by name (ParallelDims::group declares the run's): its ranks
// in row-major order of `dims` (in this order), as DeviceMesh._flatten; its collectives counted
// under `label` (the dims' names joined by '+': "dp_replicate+dp_shard").
struct MeshGroup {
    std::string name;
    std::vector<int> dims;
    std::string label;
};

class DeviceMesh {
public:
    // Collective over world: every rank must construct its mesh at the same point.
    DeviceMesh(std::vector<MeshDim> dims, Communicator& world, std::shared_ptr<CommCounter> counter);

    int world_size() const { return world_.size(); }
    int rank() const { return world_.rank(); }
    const std::vector<MeshDim>& dims() const { return dims_; }
    int ndim() const { return static_cast<int>(dims_.size()); }
    int dim_index(const std::string& name) const;  // -1 when absent
    int coord(int dim) const { return coords_[dim]; }
    const std::vector<int>& coords() const { return coords_; }
    Communicator& comm(int dim) const { return *comms_[dim]; }
    Communicator& world() const { return world_; }
    const std::shared_ptr<CommCounter>& counter() const { return counter_; }
    // Group g, built on its first request and the same one after (collective over world on that
    // first request: every rank asks for the groups in the same order). No dims and no label: null;
    // one dim counted under its own name: that dim's communicator; else a group of its own.
    Communicator* group(const MeshGroup& g);
    using Wrapper = std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)>;
    // Replaces dim `dim`'s communicator with wrap(it) (a decorator that owns it: fault injection).
    void wrap(int dim, const Wrapper& wrap);
    // Wraps every group of its own that group() makes from now on (fully_shard's over dp_shard x cp).
    void wrap_groups(Wrapper wrap) { wrap_groups_ = std::move(wrap); }

    static std::vector<int> coords_of(int rank, const std::vector<MeshDim>& dims);
    static int rank_of(const std::vector<int>& coords, const std::vector<MeshDim>& dims);

private:
    std::vector<MeshDim> dims_;
    Communicator& world_;
    std::shared_ptr<CommCounter> counter_;
    std::vector<int> coords_;
    std::vector<std::unique_ptr<Communicator>> comms_;
    std::map<std::string, std::unique_ptr<Communicator>> groups_;  // by MeshGroup::name
    Wrapper wrap_groups_;
};

}  // namespace ptool
