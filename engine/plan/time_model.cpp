#include "plan/time_model.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace ptool {

bool dim_inside_node(const Plan& plan, const std::string& dim, const Cluster& c) {
    const std::vector<int> dims = plan.dims.counted_dims(dim);
    const std::vector<MeshDim>& mesh = plan.mesh();
    if (dims.size() == 1) {
        int64_t stride = 1;  // row-major: the product of the sizes of the dims after it
        for (size_t i = mesh.size(); i-- > static_cast<size_t>(dims[0]) + 1;) stride *= mesh[i].size;
        const int64_t span = stride * mesh[dims[0]].size;
        return span <= c.gpus_per_node && c.gpus_per_node % span == 0;
    }
    if (dims.empty() || dims.size() == mesh.size())
        return plan.world_size() <= c.gpus_per_node;  // "world": every rank
    // several dims flattened (the data dims): every rank in the node of its group's first
    for (int r = 0; r < plan.world_size(); ++r) {
        std::vector<int> first = DeviceMesh::coords_of(r, mesh);
        for (int d : dims) first[d] = 0;
        if (r / c.gpus_per_node != DeviceMesh::rank_of(first, mesh) / c.gpus_per_node) return false;
    }
    return true;
}

Link collective_link(const Plan& plan, const std::string& dim, const Cluster& c) {
    if (dim_inside_node(plan, dim, c)) return c.intra;
    // rank 0's group: how many of its ranks share rank 0's node (each drives its own NIC)
    std::vector<int> dims = plan.dims.counted_dims(dim);
    const std::vector<MeshDim>& mesh = plan.mesh();
    if (dims.empty()) dims.resize(mesh.size()), std::iota(dims.begin(), dims.end(), 0);  // "world"
    int in_node = 0;
    for (int r = 0; r < std::min(plan.world_size(), c.gpus_per_node); ++r) {
        const std::vector<int> coords = DeviceMesh::coords_of(r, mesh);
        bool member = true;
        for (size_t d = 0; d < mesh.size(); ++d)
            if (std::find(dims.begin(), dims.end(), static_cast<int>(d)) == dims.end())
                member = member && coords[d] == 0;
        in_node += member;
    }
    Link l = c.inter;
    l.bandwidth = std::min(c.intra.bandwidth, std::max(1, in_node) * c.inter.bandwidth);
    return l;
}

double collective_seconds(Collective op, double bytes, int64_t calls, int n, const Link& link) {
    if (n <= 1 || calls == 0) return 0;
    return bus_bytes(op, bytes, n) / link.bandwidth + calls * collective_row(op).hops(n) * link.latency;
}

double mfu(const StepTime& t, const Cluster& c, DType compute) {
    const double peak = c.peak_flops(compute);
    return t.step > 0 && peak > 0 ? t.model_flops / (t.step * peak) : 0;
}

double compute_seconds(const MetaWork& work, const Cluster& c, DType compute) {
    return compute_terms(work, c, compute).total();
}

double p2p_seconds(double bytes, const Plan& plan, const Cluster& c) {
    const Link& link = dim_inside_node(plan, plan.dims.name(DimRole::pp), c) ? c.intra : c.inter;
    return bytes / link.bandwidth + link.latency;
}

void add_comm_time(StepTime& t, const CommByOpDim& comm, const Plan& plan, const Cluster& c) {
    for (const auto& [key, totals] : comm) {
        const auto& [op, dim] = key;
        const std::vector<int> dims = plan.dims.counted_dims(dim);
        int n = dims.empty() ? plan.world_size() : 1;
        for (int d : dims) n *= plan.mesh()[d].size;
        const bool inside = dim_inside_node(plan, dim, c);
        const bool p2p = collective_row(op).p2p;
        const Link link = p2p ? (inside ? c.intra : c.inter) : collective_link(plan, dim, c);
        // a send or recv: its row's bus factor 1 and one hop a call
        const double s = collective_seconds(op, static_cast<double>(totals.bytes), totals.calls, n, link);
        CommTime& ct = t.by_dim[dim];
        ct.seconds += s, ct.bytes += static_cast<double>(totals.bytes), ct.calls += totals.calls,
            ct.inter_node = !inside;
        const int cp = plan.dims.index(DimRole::cp);
        if (p2p) {
            // the ring's hops (context parallel's send/recv, one send and one recv per hop over a
            // full-duplex link: the sends' time) run beside the attention's compute, each next block
            // in flight while this one computes; pp's are priced by its schedule (plan/pipeline_time.h)
            if (cp >= 0 && dims == std::vector<int>{cp} && op == Collective::send) t.overlappable += s;
            continue;
        }
        // the data dims' collectives (DDP's buckets, fully_shard's) overlap the compute; so do context
        // parallel's gradient syncs (fully_shard over dp_shard x cp, the all_reduce over cp), while the
        // attention's key/value all_gathers and reduce_scatters over cp block it, as the rest do
        bool data = !dims.empty() && dim != "world", some_data = false;
        for (int d : dims)
            data = data && (plan.dims.is_data_dim(d) || d == cp), some_data |= plan.dims.is_data_dim(d);
        if (data && !some_data) data = op == Collective::all_reduce;  // cp alone: the gradients' average
        // expert parallel's all_to_alls over a data dim: the experts wait for their tokens, the layer
        // for their outputs (no overlap is modelled)
        if (op == Collective::all_to_all && plan.expert_parallel &&
            std::find(dims.begin(), dims.end(), plan.dims.index(DimRole::ep)) != dims.end())
            data = false, t.all_to_all += s;
        (data ? t.overlappable : t.blocking) += s;
    }
}

StepTime predict_step_time(const MetaWork& work, const CommByOpDim& comm, const Plan& plan, const Cluster& c,
                           DType compute) {
    StepTime t;
    t.gemm_flops = work.gemm_flops;
    t.model_flops = work.gemm_flops - work.recompute_flops;
    t.terms = compute_terms(work, c, compute);
    t.compute = t.terms.total();
    add_comm_time(t, comm, plan, c);
    t.step = t.compute + t.blocking + std::max(0.0, t.overlappable - t.compute);
    return t;
}

}  // namespace ptool
