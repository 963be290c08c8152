#include "parallel/redistribute.h"

#include "backend/backend.h"
#include "core/tensor_ops.h"

namespace ptool {
namespace {

// all_gather along dim d with torch.chunk pieces. Dim 0 is the collective's own; another dim's
// shards travel as rows of [size(d), rest] (pack_chunks) and are unpacked once.
Tensor gather_dim(const Tensor& local, int64_t d, const Shape& global, Communicator& comm) {
    if (d == 0) {
        Tensor out = Tensor::empty(global, local.dtype(), local.device());
        comm.all_gather(local, out);
        return out;
    }
    const int64_t along = global[d], rest = along ? numel_of(global) / along : 0;
    Tensor packed = Tensor::empty({along, rest}, local.dtype(), local.device());
    comm.all_gather(local.reshape({local.size(d), rest}), packed);
    return unpack_chunks(packed, global, comm.size(), d);
}

Tensor reduce_scatter_dim(const Tensor& full_partial, int64_t d, Communicator& comm) {
    Shape local_shape = full_partial.shape();
    local_shape[d] = chunk_of(local_shape[d], comm.size(), comm.rank()).length;
    if (d == 0) {
        Tensor out = Tensor::empty(local_shape, full_partial.dtype(), full_partial.device());
        comm.reduce_scatter(full_partial, out, ReduceOp::sum);
        return out;
    }
    const Tensor packed = pack_chunks(full_partial, comm.size(), d);
    Tensor out = Tensor::empty({local_shape[d], packed.size(1)}, packed.dtype(), packed.device());
    comm.reduce_scatter(packed, out, ReduceOp::sum);
    return out.reshape(local_shape);
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
