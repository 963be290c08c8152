#include "plan/device_overheads.h"

#include <set>

namespace ptool {
namespace {

// how far apart in world ranks two neighbouring pp coordinates are (ranks row-major over the mesh)
int pp_stride(const ParallelDims& dims) {
    int stride = 1;
    for (int d = dims.ndim() - 1; d > dims.index(DimRole::pp); --d) stride *= dims.mesh()[d].size;
    return stride;
}

}  // namespace

int nccl_communicators(const Plan& plan, int rank) {
    const ParallelDims& dims = plan.dims;
    int n = 0;
    for (int d = 0; d < dims.ndim(); ++d) {
        const std::optional<DimRole> role = dims.role(d);
        if (role && *role != DimRole::pp && dims.mesh()[d].size > 1) ++n;
    }
    const int pp = dims.size(DimRole::pp);
    if (pp > 1) {
        const int s = rank / pp_stride(dims) % pp;
        const bool wraps = plan.pipeline && plan.pipeline->virtual_stages > 1;
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
    o.cublas_workspace = cluster.runtime.cublas_workspace;
    o.communicators = nccl_communicators(plan, rank);
    o.nccl = o.communicators * cluster.runtime.nccl_per_communicator;
    return o;
}

DeviceOverheads worst_device_overheads(const Cluster& cluster, const Plan& plan) {
    DeviceOverheads worst = device_overheads(cluster, plan, 0);
    // the communicators differ only along pp: one rank per pp coordinate
    const ParallelDims& dims = plan.dims;
    if (const int pp = dims.size(DimRole::pp); pp > 1)
        for (int s = 1; s < pp; ++s)
            if (DeviceOverheads o = device_overheads(cluster, plan, s * pp_stride(dims));
                o.total() > worst.total())
                worst = o;
    return worst;
}

}  // namespace ptool
