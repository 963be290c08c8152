#include "comm/dim_collectives.h"

#include "core/tensor_ops.h"

namespace ptool {

Tensor all_gather_dim(const Tensor& local, int64_t d, const Shape& global, Communicator& comm) {
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

}  // namespace ptool
