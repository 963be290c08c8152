#include "parallel/redistribute.h"

#include "backend/backend.h"
#include "core/tensor_ops.h"

namespace ptool {
namespace {

// all_gather along dim d with torch.chunk pieces: move d to the front, gather rows, move back.
Tensor gather_dim(const Tensor& local, int64_t d, const Shape& global, Communicator& comm) {
    Shape front_global = global;
    std::swap(front_global[0], front_global[d]);
    Tensor front = movedim(local, d, 0);
    Shape out_shape = front.shape();
    out_shape[0] = global[d];
    Tensor out = Tensor::empty(out_shape, local.dtype(), local.device());
    comm.all_gather(front, out);
    return movedim(out, 0, d);
}

Tensor reduce_scatter_dim(const Tensor& full_partial, int64_t d, Communicator& comm) {
    Tensor front = movedim(full_partial, d, 0);
    Shape out_shape = front.shape();
    out_shape[0] = chunk_of(front.size(0), comm.size(), comm.rank()).length;
    Tensor out = Tensor::empty(out_shape, front.dtype(), front.device());
    comm.reduce_scatter(front, out, ReduceOp::sum);
    return movedim(out, 0, d);
}

}  // namespace

Tensor redistribute(const Tensor& local, const Placement& from_in, const Placement& to_in, const Shape& global,
                    Communicator& comm) {
    const int64_t nd = static_cast<int64_t>(global.size());
    const Placement from = from_in.normalized(nd), to = to_in.normalized(nd);
    if (comm.size() == 1) return local;  // Megatron's helpers: nothing to do at world size 1
    if (from.same_as(to, nd)) return local;
    if (from.is_shard() && to.is_replicate()) return gather_dim(local, from.dim, global, comm);
    if (from.is_partial() && to.is_replicate()) {
        Tensor out = local.clone();
        comm.all_reduce(out, ReduceOp::sum);
        return out;
    }
    if (from.is_partial() && to.is_shard()) return reduce_scatter_dim(local, to.dim, comm);
    if (from.is_replicate() && to.is_shard()) return chunk(local, comm.size(), comm.rank(), to.dim);
    if (from.is_shard() && to.is_shard())
        return chunk(gather_dim(local, from.dim, global, comm), comm.size(), comm.rank(), to.dim);
    if (from.is_replicate() && to.is_partial()) {
        Tensor out = local.clone();
        if (comm.rank() != 0) backend_for(out.device()).fill(out, 0.0);
        return out;
    }
    throw InputError(fmt::format("cannot redistribute {} to {}", from.str(), to.str()));
}

Tensor redistribute_backward(const Tensor& grad_local, const Placement& grad_placement, const Placement& from,
                             const Shape& global, Communicator& comm) {
    // the gradient of a Partial tensor is Replicate: every summand receives the whole gradient
    const Placement want = from.is_partial() ? Placement::replicate() : from;
    return redistribute(grad_local, grad_placement, want, global, comm);
}

Tensor full_tensor(const Tensor& local, const Placement& p, const Shape& global, Communicator& comm) {
    return redistribute(local, p, Placement::replicate(), global, comm);
}

}  // namespace ptool
