#include "plan/device_overheads.h"

#include <set>

namespace ptool {

int nccl_communicators(const Plan& plan, int rank) {
    const ParallelDims& dims = plan.dims;
    int n = 0;
    for (int d = 0; d < dims.ndim(); ++d) {
        const std::optional<DimRole> role = dims.role(d);
        if (role && *role != DimRole::pp && dims.mesh()[d].size > 1) ++n;
    }
    if (dims.cp_shards_params()) ++n;  // fully_shard's group over dp_shard x cp (dp_shard_cp)
    const int pp = dims.size(DimRole::pp);
    if (pp > 1) {
        const int s = DeviceMesh::coords_of(rank, dims.mesh())[dims.index(DimRole::pp)];
        // the loop's last rank sends on to rank 0's next stage; the V turns on its last rank
        const bool wraps =
            plan.pipeline && plan.pipeline->virtual_stages > 1 && !v_placed(plan.pipeline->schedule);
        std::set<int> peers;
        for (int peer : {s - 1, s + 1})
            if (peer >= 0 && peer < pp)
                peers.insert(peer);
            else if (wraps)
                peers.insert((peer + pp) % pp);
        peers.erase(s);
        n += static_cast<int>(peers.size());
    }
    return n;
}

DeviceOverheads device_overheads(const Cluster& cluster, const Plan& plan, int rank) {
    DeviceOverheads o;
    o.cuda_context = cluster.runtime.cuda_context;
    o.step_runtime = cluster.runtime.step_runtime;
    o.cublas_workspaces = kCublasWorkspaces * cluster.runtime.cublas_workspace;
    o.communicators = nccl_communicators(plan, rank);
    o.nccl = o.communicators * cluster.runtime.nccl_per_communicator;
    return o;
}

DeviceOverheads worst_device_overheads(const Cluster& cluster, const Plan& plan) {
    DeviceOverheads worst = device_overheads(cluster, plan, 0);
    // the communicators differ only along pp: one rank per pp coordinate
    const ParallelDims& dims = plan.dims;
    std::vector<int> coords(dims.ndim(), 0);
    for (int s = 1; s < dims.size(DimRole::pp); ++s) {
        coords[dims.index(DimRole::pp)] = s;
        if (DeviceOverheads o = device_overheads(cluster, plan, DeviceMesh::rank_of(coords, dims.mesh()));
            o.total() > worst.total())
            worst = o;
    }
    return worst;
}

}  // namespace ptool
