#include "parallel/fully_shard.h"

#include <map>
#include <optional>

#include "core/framework_memory.h"
#include "core/tensor_ops.h"
#include "model/float8_cost.h"
#include "model/float8_gemm.h"
#include "model/float8_linear.h"
#include "parallel/float8_training.h"
#include "parallel/plan.h"

namespace ptool {

// FSDP2's FSDPCommContext as the framework tally sees it (core/framework_memory.h): the forward's
// all-gather output, kept until the next unit's copy-out (the root's forward end flushes it); the
// reduce-scatter input, kept until the next unit's reduce-scatter; and each unit's gradient, the
// reduce-scatter's output on its stream, alive until zero_grad(set_to_none) (taken as the step's end:
// the next step's first forward).
// In backward each unit's pre-backward also starts the all-gather of the unit that ran its forward
// before it (FSDP2's default backward prefetch): that output, allocated then on the all-gather
// stream, stands in until the unit's own unshard copies out of it.
struct FsdpCommContext {
    Tensor all_gather_state, reduce_scatter_state;
    std::vector<Tensor*> grads;             // every unit's
    std::vector<const void*> post_forward;  // the units in the order their forwards ended (a step's)
    std::map<const void*, Tensor> prefetched;
    int64_t step = -1;  // the step whose forwards and backwards these are
};

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
        // accumulate: the step's unsharded gradient, summed over its backwards in reduce_dtype
        // (full_grad itself where the dtypes agree); reduce_scatter once, by finish_backward
        Tensor accumulated;
        // the float8 all-gather (FsdpFloat8): the float8 linear this is the weight of, else null
        Module* float8 = nullptr;
        DType gathered = DType::float32;  // what the all-gather moves of it: the compute dtype, or codes
        int64_t gather_offset = 0;        // in a rank's region of the all-gather buffer, its elements
        float scale = 0;                  // float8: the scale of its last gather
        float precomputed = 0;            // float8: precompute's, for the next gathers (0: none yet)
    };
    std::string fqn;
    bool root = false;
    bool gathered = false;  // the full parameters are unsharded now
    std::vector<Managed> params;
    int64_t region = 0;  // a rank's elements of the reduce-scatter's flat buffer
    // the all-gather's flat buffer: in the compute dtype, or bytes where float8 codes join other
    // parameters (FSDP2's uint8 buffer for mixed dtypes); a rank's elements of it
    DType gather_dtype = DType::float32;
    int64_t gather_region = 0;
    std::shared_ptr<const FsdpFloat8> float8;
    Communicator* comm = nullptr;
    Communicator* replicas = nullptr;  // HSDP: the shards' replicas, averaged after the reduce_scatter
    Backend* be = nullptr;
    DType compute = DType::float32, reduce = DType::float32;  // the gathered parameters' and the reduction's
    std::shared_ptr<FsdpCommContext> ctx;
    Tensor torch_grad;  // the unit's sharded gradients as PyTorch holds them (framework tally only)
    std::vector<size_t> post_forward_indices;  // where this unit's forwards ended in ctx->post_forward
    int64_t step = -1;
    ReduceOp grad_reduce = ReduceOp::avg;  // avg, or sum under global_tokens (gradient_divide_factor 1)
    // torch.distributed.pipelining's FSDP2 under every microbatch but the stage's last
    // (set_requires_gradient_sync(False), set_reshard_after_backward(False)): the backwards accumulate
    // into one unsharded gradient and the stage's last reduce_scatters it (finish_backward). Set for
    // the split-backward schedules, whose W of a microbatch may follow the I of the next.
    bool accumulate = false;

    // The full-size gradients a backward writes into: fresh ones, or under accumulate the step's.
    void bind_grads() {
        MemoryUseScope use(MemoryUse::fsdp_unsharded);
        for (Managed& m : params) {
            if (!accumulate || !m.full_grad.defined())
                m.full_grad = Tensor(m.full_shape, compute, m.shard.device());
            if (accumulate && !m.accumulated.defined())
                m.accumulated =
                    reduce == compute ? m.full_grad : Tensor(m.full_shape, reduce, m.shard.device());
            m.p->grad = m.full_grad;
        }
    }

    void lay_out_gather() {
        gather_dtype = params[0].gathered;
        for (const Managed& m : params)
            if (m.gathered != gather_dtype) gather_dtype = DType::uint8;
        gather_region = 0;
        for (Managed& m : params)
            m.gather_offset = gather_region, gather_region += gather_elements(m.padded * m.row, m);
    }
    // n of m's elements in the all-gather buffer's elements
    int64_t gather_elements(int64_t n, const Managed& m) const {
        return n * static_cast<int64_t>(dtype_size(m.gathered) / dtype_size(gather_dtype));
    }
    // n of m's elements at `start` of the all-gather buffer, as m's dtype
    Tensor segment(const Tensor& buf, int64_t start, const Managed& m, int64_t n) const {
        return buf.narrow(0, start, gather_elements(n, m)).view(m.gathered);
    }

    std::vector<Communicator*> float8_group(const Float8Gemms& f) const {
        std::vector<Communicator*> out{comm};
        if (f.tp.weight.any() && float8->tp && float8->tp->size() > 1) out.push_back(float8->tp);
        return out;
    }
    // Each float8 weight's scale for this gather: precompute's, or its amax over its shards now
    // (torchao's fsdp_pre_all_gather: one all_reduce a weight)
    void float8_scales() {
        CommScope scope(comm->counter().get(), fqn, CommSiteKind::unshard);
        for (Managed& m : params) {
            if (!m.float8) continue;
            const Float8Gemms& f = *m.float8->float8();
            if (m.precomputed > 0) {
                m.scale = m.precomputed;
                continue;
            }
            float8_count_amax(m.shard);
            const double amax = float8_amax_over({m.shard}, float8_group(f), f.recipe.reduce_amax)[0];
            m.scale = float8_tensorwise_scale(amax, f.recipe.weight);
        }
    }

    void unshard(bool for_backward) {
        MemoryUseScope use(MemoryUse::communication);  // the flat buffers; the unit's parameters below
        const int n = comm->size();
        float8_scales();
        // FSDP2 casts and copies in on its all-gather stream; at one rank it casts each parameter on
        // the compute stream and gathers nothing
        std::optional<TorchAllocScope> stream;
        if (n > 1) stream.emplace(TorchAlloc::both, AllocStream::all_gather);
        auto fetched = ctx->prefetched.find(this);
        Tensor prefetched = fetched == ctx->prefetched.end() ? Tensor() : fetched->second;
        if (fetched != ctx->prefetched.end()) ctx->prefetched.erase(fetched);
        // the copies convert to compute, the float8 weights' casts to their codes
        Tensor local = Tensor({gather_region}, gather_dtype, params[0].shard.device());
        for (Managed& m : params) {
            if (m.shard.numel() == 0) continue;
            Tensor dst = segment(local, m.gather_offset, m, m.shard.numel());
            if (m.float8) {
                float8_cast_codes(m.shard, m.float8->float8()->recipe.weight, m.scale, dst);
                continue;
            }
            Tensor typed = dst.reshape(m.shard.shape());
            be->copy(m.shard, typed);
        }
        Tensor all, kept;  // the forward's output is kept past the copy-out (FsdpCommContext)
        {
            std::optional<TorchAllocScope> own;
            if (n == 1 || !for_backward || prefetched.defined()) own.emplace(TorchAlloc::ptool_only);
            all = Tensor::empty({n * gather_region}, local.dtype(), local.device());
        }
        if (n > 1 && !for_backward)
            kept = torch_only({n * gather_region}, local.dtype(), MemoryUse::communication,
                              AllocStream::all_gather);
        {
            CommScope scope(comm->counter().get(), fqn, CommSiteKind::unshard);
            comm->all_gather(local, all);
        }
        stream.reset();
        MemoryUseScope unsharded(MemoryUse::fsdp_unsharded);
        for (Managed& m : params) {
            m.full = Tensor::empty(m.full_shape, m.gathered, m.shard.device());
            if (m.full.device() == Device::meta) {  // no values: one copy of the same bytes
                Tensor flat = m.full.reshape({m.full.numel()});
                be->copy(segment(all, 0, m, m.full.numel()), flat);
                continue;
            }
            for (int r = 0; r < n; ++r) {
                const Chunk c = chunk_of(m.full_shape[0], n, r);
                if (c.length == 0) continue;
                Tensor src = segment(all, r * gather_region + m.gather_offset, m, c.length * m.row);
                Tensor dst = m.full.narrow(0, c.offset, c.length);
                Tensor dst_flat = dst.reshape({c.length * m.row});
                be->copy(src, dst_flat);
            }
        }
        gathered = true;
        if (kept.defined())
            ctx->all_gather_state = kept;  // the previous unit's output freed after this copy-out
        prefetched = Tensor();
        for (Managed& m : params) m.p->value = m.full, m.p->float8_scale = m.float8 ? m.scale : 0;
        if (for_backward) bind_grads();
    }

    // Frees the unsharded parameters and gradients, as FSDP2's reshard does; under accumulate the
    // step's gradients stay (their W may come after another microbatch's forward)
    void reshard() {
        gathered = false;
        for (Managed& m : params) {
            m.p->value = m.shard, m.p->float8_scale = 0;
            m.full = Tensor();
            if (!m.accumulated.defined()) m.full_grad = Tensor();
            m.p->grad = m.accumulated.defined() ? m.full_grad : m.shard_grad;
        }
    }

    // FSDP2's foreach_reduce in the framework tally: the reduce-scatter input in reduce_dtype on the
    // compute stream (the previous unit's freed first), its output on the reduce-scatter stream,
    // which becomes the sharded gradient (cast to the parameters' dtype when that differs) or is
    // added into it and freed
    void torch_reduce_buffers() {
        ctx->reduce_scatter_state = Tensor();
        ctx->reduce_scatter_state = torch_only({comm->size() * region}, reduce, MemoryUse::communication);
        Tensor output = torch_only({region}, reduce, MemoryUse::gradients, AllocStream::reduce_scatter);
        const DType master = params[0].shard_grad.dtype();
        if (torch_grad.defined()) return;  // accumulated into: the output is freed
        if (master != reduce)
            output = torch_only({region}, master, MemoryUse::gradients, AllocStream::reduce_scatter);
        torch_grad = output;
    }

    void reduce_grads() {
        MemoryUseScope use(MemoryUse::communication);
        torch_reduce_buffers();
        TorchAllocScope own(TorchAlloc::ptool_only);  // ptool's buffers, the framework's above
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

    Placed pre_forward(RunContext& rc, Module&, const Placed& x) override {
        if (rc.step != ctx->step) {  // a new step: zero_grad(set_to_none) has run
            ctx->step = rc.step;
            for (Tensor* g : ctx->grads) *g = Tensor();
            ctx->post_forward.clear();
            ctx->prefetched.clear();
            ctx->reduce_scatter_state = Tensor();
        }
        if (rc.step != step) step = rc.step, post_forward_indices.clear();
        unshard(false);
        return x;
    }
    Placed post_forward(RunContext& rc, Module&, const Placed& y) override {
        if (!root) reshard();
        if (root) ctx->all_gather_state = Tensor();  // the forward's end flushes the kept output
        if (!rc.recomputing)
            post_forward_indices.push_back(ctx->post_forward.size()), ctx->post_forward.push_back(this);
        return y;
    }
    // FSDP2's backward prefetch: the unit whose forward ended before this one's
    void prefetch_previous() {
        if (post_forward_indices.empty()) return;
        const size_t index = post_forward_indices.back();
        post_forward_indices.pop_back();
        if (index == 0 || index > ctx->post_forward.size() || comm->size() == 1)
            return;  // at one rank FSDP2 gathers nothing
        const auto* target = static_cast<const State*>(ctx->post_forward[index - 1]);
        if (target->gathered || ctx->prefetched.count(target)) return;
        ctx->prefetched[target] = torch_only({comm->size() * target->gather_region}, target->gather_dtype,
                                             MemoryUse::communication, AllocStream::all_gather);
    }
    Placed post_forward_backward(RunContext&, Module&, const Placed& dy) override {
        // the root keeps its parameters from the forward, unless another microbatch's backward
        // resharded them since (a schedule that runs several forwards first): gathered again
        if (root && gathered) {
            bind_grads();
        } else {
            unshard(true);
        }
        prefetch_previous();
        return dy;
    }
    void post_backward(RunContext&, Module&) override {
        if (accumulate) {  // torch's accumulate_unsharded_grad_if_needed: into reduce_dtype, zeroed
            if (reduce != compute)
                for (Managed& m : params) {
                    be->axpy(1.0, to_dtype(*be, m.full_grad, reduce), m.accumulated);
                    be->fill(m.full_grad, 0.0);
                }
            return;
        }
        reduce_grads();
        reshard();
        if (root) ctx->reduce_scatter_state = Tensor();  // the root's final callback frees it
    }
    // The stage's last backward under accumulate: the one reduce_scatter of the step's gradients
    void finish_backward() {
        if (!accumulate || params.empty() || !params[0].accumulated.defined()) return;
        for (Managed& m : params) m.full_grad = m.accumulated, m.accumulated = Tensor();
        reduce_grads();
        reshard();
        if (root) ctx->reduce_scatter_state = Tensor();
    }
};

FullyShard::FullyShard(Model& model, const std::vector<FsdpUnitSpec>& units, Communicator& dp,
                       Communicator* replicas, Backend& be, const MixedPrecisionSpec* mp,
                       ReduceOp grad_reduce, bool accumulate, const FsdpFloat8* float8) {
    const auto named = model.named_parameters();
    std::map<std::string, ParamPtr> by_name(named.begin(), named.end());
    std::map<std::string, Module*> modules;
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) { modules[fqn] = &m; });
    const int n = dp.size(), r = dp.rank();
    auto ctx = std::make_shared<FsdpCommContext>();
    // the float8 all-gather (the caller asks for it where the units gather: float8_all_gathers)
    auto f8 = float8 ? std::make_shared<const FsdpFloat8>(*float8) : nullptr;
    for (const FsdpUnitSpec& u : units) {
        if (u.params.empty()) continue;  // nothing of its own to shard: FSDP2 makes no group either
        auto st = std::make_shared<State>();
        st->fqn = u.fqn;
        st->root = u.fqn.empty();
        st->comm = &dp;
        st->replicas = replicas && replicas->size() > 1 && !u.experts ? replicas : nullptr;
        st->be = &be;
        st->ctx = ctx;
        ctx->grads.push_back(&st->torch_grad);
        st->compute = mp ? mp->param_dtype : model.dtype;
        st->reduce = mp ? mp->reduce_dtype : model.dtype;
        st->grad_reduce = grad_reduce;
        st->accumulate = accumulate;
        st->float8 = f8;
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
            TorchAllocScope own(TorchAlloc::ptool_only);  // PyTorch's are born in the reduce-scatter
            m.shard_grad = Tensor(m.shard.shape(), m.shard.dtype(), m.shard.device());
            m.p->value = m.shard;
            m.p->grad = m.shard_grad;
            m.gathered = st->compute;
            if (f8)
                if (Module* linear = float8_linear_of(name, modules))
                    m.float8 = linear, m.gathered = DType::uint8;
            managed_.insert(m.p.get());
            st->params.push_back(std::move(m));
        }
        st->lay_out_gather();
        // a moe layer's experts: hooked on the layer, which calls each of them
        modules.at(u.hooked_on())->add_outer_hooks(st);
        units_.push_back(st);
    }
}

void FullyShard::precompute_float8_scales() {
    std::vector<State::Managed*> weights;
    std::vector<Tensor> shards;
    bool tp_cut = false;
    for (const auto& u : units_)
        for (State::Managed& m : u->params)
            if (m.float8)
                weights.push_back(&m), shards.push_back(m.shard),
                    tp_cut |= m.float8->float8()->tp.weight.any();
    if (weights.empty()) return;
    const State& first = *units_.front();
    std::vector<Communicator*> over{first.comm};
    if (tp_cut && first.float8->tp && first.float8->tp->size() > 1) over.push_back(first.float8->tp);
    float8_count_precompute(shards);
    std::vector<double> amax;
    {
        CommScope scope(first.comm->counter().get(), first.fqn, CommSiteKind::unshard);
        amax = float8_amax_over(shards, over);
    }
    for (size_t i = 0; i < weights.size(); ++i) {
        State::Managed& m = *weights[i];
        const Float8Gemms& f = *m.float8->float8();
        if (first.float8->stale_scales.count(m.name)) {
            m.precomputed = m.scale;  // taken before the step: the last gather's
            continue;
        }
        // a recipe that does not reduce (the fault layer's) takes its shard's own
        const double a = f.recipe.reduce_amax ? amax[i] : float8_amax(m.shard);
        m.precomputed = float8_tensorwise_scale(a, f.recipe.weight);
    }
}

void FullyShard::finish_backward() {
    for (const auto& u : units_) u->finish_backward();  // torch's order: its states', the root's first
}

bool FullyShard::manages(const Parameter* p) const {
    return managed_.count(p) > 0;
}

}  // namespace ptool
