#include "parallel/fully_shard.h"

#include <map>

#include "core/tensor_ops.h"
#include "parallel/plan.h"

namespace ptool {

// One unit: its parameters, their shards, and the flat layout both collectives use. Rank r's
// region of the flat buffer holds, per parameter, rows chunk_of(rows, n, r) padded to the
// largest chunk (ceil(rows / n)), so every rank's region has the same size `region`.
struct FullyShard::State : ModuleHooks {
    struct Managed {
        std::string name;
        ParamPtr p;
        Shape full_shape;
        int64_t row = 1;     // elements per dim-0 row
        int64_t padded = 0;  // rows per rank in the flat buffer
        int64_t offset = 0;  // of this parameter in a rank's region
        Tensor shard, shard_grad;
        Tensor full, full_grad;  // while unsharded
    };
    std::string fqn;
    bool root = false;
    bool gathered = false;  // the full parameters are unsharded now
    std::vector<Managed> params;
    int64_t region = 0;
    Communicator* comm = nullptr;
    Communicator* replicas = nullptr;  // HSDP: the shards' replicas, averaged after the reduce_scatter
    Backend* be = nullptr;
    DType compute = DType::float32, reduce = DType::float32;  // the gathered parameters' and the reduction's
    ReduceOp grad_reduce = ReduceOp::avg;  // avg, or sum under global_tokens (gradient_divide_factor 1)

    void unshard(bool for_backward) {
        MemoryUseScope use(MemoryUse::communication);  // the flat buffers; the unit's parameters below
        const int n = comm->size();
        Tensor local = Tensor({region}, compute, params[0].shard.device());  // the copies convert to compute
        for (Managed& m : params) {
            if (m.shard.numel() == 0) continue;
            Tensor dst = local.narrow(0, m.offset, m.shard.numel()).reshape(m.shard.shape());
            be->copy(m.shard, dst);
        }
        Tensor all = Tensor::empty({n * region}, local.dtype(), local.device());
        {
            CommScope scope(comm->counter().get(), fqn, CommSiteKind::unshard);
            comm->all_gather(local, all);
        }
        MemoryUseScope unsharded(MemoryUse::fsdp_unsharded);
        for (Managed& m : params) {
            m.full = Tensor::empty(m.full_shape, compute, m.shard.device());
            if (m.full.device() == Device::meta) {  // no values: one copy of the same bytes
                Tensor flat = m.full.reshape({m.full.numel()});
                be->copy(all.narrow(0, 0, m.full.numel()), flat);
                continue;
            }
            for (int r = 0; r < n; ++r) {
                const Chunk c = chunk_of(m.full_shape[0], n, r);
                if (c.length == 0) continue;
                Tensor src = all.narrow(0, r * region + m.offset, c.length * m.row);
                Tensor dst = m.full.narrow(0, c.offset, c.length);
                Tensor dst_flat = dst.reshape({c.length * m.row});
                be->copy(src, dst_flat);
            }
        }
        gathered = true;
        for (Managed& m : params) {
            m.p->value = m.full;
            if (for_backward) {
                m.full_grad = Tensor(m.full_shape, compute, m.shard.device());
                m.p->grad = m.full_grad;
            }
        }
    }

    void reshard() {  // frees the unsharded parameters and gradients, as FSDP2's reshard does
        gathered = false;
        for (Managed& m : params) {
            m.p->value = m.shard;
            m.p->grad = m.shard_grad;
            m.full = Tensor();
            m.full_grad = Tensor();
        }
    }

    void reduce_grads() {
        MemoryUseScope use(MemoryUse::communication);
        const int n = comm->size();
        const DType dt = reduce;
        const Device dev = params[0].shard.device();
        Tensor out({region}, dt, dev);
        Tensor in({n * region}, dt, dev);  // rank k's region: its rows of every parameter, padded
        for (Managed& m : params) {
            if (dev == Device::meta) {  // no values: one copy of the same bytes
                Tensor dst = in.narrow(0, 0, m.full_grad.numel());
                be->copy(m.full_grad.reshape({m.full_grad.numel()}), dst);
                continue;
            }
            for (int k = 0; k < n; ++k) {
                const Chunk c = chunk_of(m.full_shape[0], n, k);
                if (c.length == 0) continue;
                Tensor src = m.full_grad.narrow(0, c.offset, c.length).reshape({c.length * m.row});
                Tensor dst = in.narrow(0, k * region + m.offset, c.length * m.row);
                be->copy(src, dst);
            }
        }
        {
            CommScope scope(comm->counter().get(), fqn, CommSiteKind::reduce_grads);
            comm->reduce_scatter(in, out, grad_reduce);
            if (replicas) replicas->all_reduce(out, grad_reduce);
        }
        for (Managed& m : params) {  // accumulate: a shared unit runs its backward more than once
            if (m.shard_grad.numel() == 0) continue;
            Tensor part = out.narrow(0, m.offset, m.shard_grad.numel()).reshape(m.shard_grad.shape());
            be->axpy(1.0, to_dtype(*be, part, m.shard_grad.dtype()),
                     m.shard_grad);  // reduce_dtype -> the masters'
        }
    }

    Placed pre_forward(RunContext&, Module&, const Placed& x) override {
        unshard(false);
        return x;
    }
    Placed post_forward(RunContext&, Module&, const Placed& y) override {
        if (!root) reshard();
        return y;
    }
    Placed post_forward_backward(RunContext&, Module&, const Placed& dy) override {
        // the root keeps its parameters from the forward, unless another microbatch's backward
        // resharded them since (a schedule that runs several forwards first): gathered again
        if (root && gathered) {
            MemoryUseScope use(MemoryUse::fsdp_unsharded);
            for (Managed& m : params) {
                m.full_grad = Tensor(m.full_shape, compute, m.shard.device());
                m.p->grad = m.full_grad;
            }
        } else {
            unshard(true);
        }
        return dy;
    }
    void post_backward(RunContext&, Module&) override {
        reduce_grads();
        reshard();
    }
};

FullyShard::FullyShard(Model& model, const std::vector<FsdpUnitSpec>& units, Communicator& dp,
                       Communicator* replicas, Backend& be, const MixedPrecisionSpec* mp,
                       ReduceOp grad_reduce) {
    const auto named = model.named_parameters();
    std::map<std::string, ParamPtr> by_name(named.begin(), named.end());
    std::map<std::string, Module*> modules;
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) { modules[fqn] = &m; });
    const int n = dp.size(), r = dp.rank();
    for (const FsdpUnitSpec& u : units) {
        if (u.params.empty()) continue;  // nothing of its own to shard: FSDP2 makes no group either
        auto st = std::make_shared<State>();
        st->fqn = u.fqn;
        st->root = u.fqn.empty();
        st->comm = &dp;
        st->replicas = replicas && replicas->size() > 1 && !u.experts ? replicas : nullptr;
        st->be = &be;
        st->compute = mp ? mp->param_dtype : model.dtype;
        st->reduce = mp ? mp->reduce_dtype : model.dtype;
        st->grad_reduce = grad_reduce;
        for (const std::string& name : u.params) {
            State::Managed m;
            m.name = name;
            m.p = by_name.at(name);
            m.full_shape = m.p->value.shape();
            PTOOL_REQUIRE(!m.full_shape.empty(), "fully_shard of the scalar parameter '{}'", name);
            m.row = m.p->value.numel() / std::max<int64_t>(1, m.full_shape[0]);
            m.padded = chunk_of(m.full_shape[0], n, 0).length;
            m.offset = st->region;
            st->region += m.padded * m.row;
            {
                MemoryUseScope use(MemoryUse::parameters);
                m.shard = chunk(m.p->value, n, r, 0);
            }
            MemoryUseScope use(MemoryUse::gradients);
            m.shard_grad = Tensor(m.shard.shape(), m.shard.dtype(), m.shard.device());
            m.p->value = m.shard;
            m.p->grad = m.shard_grad;
            st->params.push_back(std::move(m));
        }
        // a moe layer's experts: hooked on the layer, which calls each of them
        modules.at(u.hooked_on())->add_outer_hooks(st);
        units_.push_back(st);
    }
}

bool FullyShard::manages(const Parameter* p) const {
    for (const auto& u : units_)
        for (const auto& m : u->params)
            if (m.p.get() == p) return true;
    return false;
}

}  // namespace ptool
