#include "parallel/redistribute.h"

#include <optional>

#include "backend/backend.h"
#include "comm/dim_collectives.h"
#include "core/tensor_ops.h"

namespace ptool {
namespace {

// The collective a step runs (none: chunk and zero_others are local)
std::optional<Collective> collective_of(RedistOp op) {
    switch (op) {
        case RedistOp::all_gather:
            return Collective::all_gather;
        case RedistOp::all_reduce:
            return Collective::all_reduce;
        case RedistOp::reduce_scatter:
            return Collective::reduce_scatter;
        default:
            return std::nullopt;
    }
}

}  // namespace

std::vector<RedistStep> redistribution_steps(const Placement& from_in, const Placement& to_in, int64_t ndim,
                                             int parts) {
    const Placement from = from_in.normalized(ndim), to = to_in.normalized(ndim);
    PTOOL_REQUIRE(
        !from.is_owned() && !to.is_owned(),
        "an expert's Owned placement is gathered from its owner (verify/recorder.cpp), not redistributed");
    if (parts == 1 || from.same_as(to, ndim)) return {};  // Megatron's helpers: nothing to do at world size 1
    if (from.is_shard() && to.is_replicate()) return {{RedistOp::all_gather, from.dim}};
    if (from.is_partial() && to.is_replicate()) return {{RedistOp::all_reduce}};
    if (from.is_partial() && to.is_shard()) return {{RedistOp::reduce_scatter, to.dim}};
    if (from.is_replicate() && to.is_shard()) return {{RedistOp::chunk, to.dim}};
    if (from.is_shard() && to.is_shard())
        return {{RedistOp::all_gather, from.dim}, {RedistOp::chunk, to.dim}};
    if (from.is_replicate() && to.is_partial()) return {{RedistOp::zero_others}};
    return {{RedistOp::all_gather, from.dim}, {RedistOp::zero_others}};  // Shard -> Partial
}

std::vector<CommCost> redistribute_cost(const Placement& from, const Placement& to, const Shape& global,
                                        int parts, size_t element_size) {
    std::vector<CommCost> out;
    const int64_t bytes = bytes_of(global, element_size);
    for (const RedistStep& s : redistribution_steps(from, to, static_cast<int64_t>(global.size()), parts))
        if (const std::optional<Collective> c = collective_of(s.op))
            out.push_back({*c, bytes, "", Phase::forward});
    return out;
}

Tensor redistribute(const Tensor& local, const Placement& from, const Placement& to, const Shape& global,
                    Communicator& comm) {
    Tensor t = local;
    for (const RedistStep& s :
         redistribution_steps(from, to, static_cast<int64_t>(global.size()), comm.size())) {
        switch (s.op) {
            case RedistOp::all_gather:
                t = all_gather_dim(t, s.dim, global, comm);
                break;
            case RedistOp::all_reduce:
                t = t.clone();
                comm.all_reduce(t, ReduceOp::sum);
                break;
            case RedistOp::reduce_scatter:
                t = reduce_scatter_dim(t, s.dim, comm);
                break;
            case RedistOp::chunk:
                t = chunk(t, comm.size(), comm.rank(), s.dim);
                break;
            case RedistOp::zero_others:
                t = t.clone();
                if (comm.rank() != 0) backend_for(t.device()).fill(t, 0.0);
                break;
        }
    }
    return t;
}

Placed redistribute(const Placed& x, const Placement& to, Communicator& comm) {
    return {redistribute(x.t, x.p, to, x.global, comm), to, x.global};
}

Tensor full_tensor(const Tensor& local, const Placement& p, const Shape& global, Communicator& comm) {
    return redistribute(local, p, Placement::replicate(), global, comm);
}

}  // namespace ptool
