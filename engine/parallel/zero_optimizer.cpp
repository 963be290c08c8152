#include "parallel/zero_optimizer.h"

#include <algorithm>

#include "comm/comm_stats.h"
#include "core/memory_account.h"

namespace ptool {
namespace {

Tensor flat_view(const Tensor& t) {
    return t.reshape({t.numel()});
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(int stage, int rotation, std::vector<Bucket> buckets, Communicator& dp,
                             Backend& be, DType reduce, ReduceOp grad_reduce)
    : stage_(stage), dp_(dp), be_(be), reduce_(reduce), grad_reduce_(grad_reduce) {
    const int d = dp.size();
    owner_ = ((dp.rank() + rotation) % d + d) % d;
    flats_.reserve(buckets.size());
    for (Bucket& b : buckets) {
        Flat f;
        f.root = b.root, f.index = b.index;
        for (const ParamPtr& p : b.params) {
            f.spans.push_back({p, f.numel, p->value.numel()});
            managed_.insert(p.get());
            f.numel += p->value.numel();
        }
        f.shard = (f.numel + d - 1) / d;
        if (stage_ == 2 && !f.spans.empty()) {
            MemoryUseScope use(MemoryUse::gradients);
            const Tensor& g = f.spans[0].p->grad;
            f.grad_shard = Tensor({f.shard}, g.dtype(), g.device());
        }
        flats_.push_back(std::move(f));
    }
}

bool ZeroOptimizer::manages(const Parameter* p) const {
    return managed_.count(p) > 0;
}

std::vector<ZeroOptimizer::Piece> ZeroOptimizer::pieces(const Flat& f, int owner) const {
    std::vector<Piece> out;
    const int64_t lo = owner * f.shard, hi = std::min(f.numel, lo + f.shard);
    for (const Span& s : f.spans) {
        const int64_t a = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
        if (a < e) out.push_back({&s, a - s.offset, a - lo, e - a});
    }
    return out;
}

void ZeroOptimizer::before_step() {
    if (stage_ != 2) return;
    MemoryUseScope use(MemoryUse::gradients);
    for (Flat& f : flats_)
        for (Span& s : f.spans)
            s.p->grad = Tensor(s.p->value.shape(), f.grad_shard.dtype(), s.p->value.device());  // zeros
}

void ZeroOptimizer::reduce_scatter_gradients() {
    reduce_scatter_bytes_ = 0;
    if (stage_ != 2) return;
    const int d = dp_.size();
    for (Flat& f : flats_) {
        if (f.spans.empty()) continue;
        const Device dev = f.grad_shard.device();
        {
            MemoryUseScope use(MemoryUse::communication);
            Tensor in({d * f.shard}, reduce_, dev);  // zeros: the padding
            for (const Span& s : f.spans) {
                Tensor dst = in.narrow(0, s.offset, s.numel);
                be_.copy(flat_view(s.p->grad), dst);  // the gradient's dtype -> reduce_dtype
            }
            Tensor out({f.shard}, reduce_, dev);
            {
                CommScope scope(dp_.counter().get(), f.root, CommSite::of_bucket(f.index));
                dp_.reduce_scatter(in, out, grad_reduce_);
            }
            reduce_scatter_bytes_ += static_cast<int64_t>(in.nbytes());
            be_.copy(out, f.grad_shard);  // reduce_dtype -> the masters'
        }
        for (Span& s : f.spans) s.p->grad = Tensor();  // freed until the next backward
    }
}

std::vector<Tensor> ZeroOptimizer::grad_pieces(const Parameter* p) const {
    if (stage_ != 2) return {p->grad};
    std::vector<Tensor> out;
    for (const Flat& f : flats_)
        for (const Piece& pc : pieces(f, dp_.rank()))  // the shard the reduce_scatter left here
            if (pc.span->p.get() == p) out.push_back(f.grad_shard.narrow(0, pc.in_shard, pc.length));
    return out;
}

void ZeroOptimizer::step(Optimizer& opt, const std::vector<std::pair<std::string, ParamPtr>>& others) {
    std::vector<Optimizer::Piece> todo;
    for (const Flat& f : flats_)
        for (const Piece& pc : pieces(f, owner_)) {
            const ParamPtr& p = pc.span->p;
            Tensor grad = stage_ == 2 ? f.grad_shard.narrow(0, pc.in_shard, pc.length)
                                      : flat_view(p->grad).narrow(0, pc.at, pc.length);
            todo.push_back({pc.span, flat_view(p->value).narrow(0, pc.at, pc.length), grad});
        }
    for (const auto& [name, p] : others) todo.push_back({p.get(), p->value, p->grad});
    opt.step(todo);
    all_gather_bytes_ = 0;
    const int d = dp_.size();
    for (const Flat& f : flats_) {
        if (f.spans.empty()) continue;
        MemoryUseScope use(MemoryUse::communication);
        const Tensor& first = f.spans[0].p->value;
        Tensor mine({f.shard}, first.dtype(), first.device());  // the shard this rank updated
        for (const Piece& pc : pieces(f, owner_)) {
            Tensor dst = mine.narrow(0, pc.in_shard, pc.length);
            be_.copy(flat_view(pc.span->p->value).narrow(0, pc.at, pc.length), dst);
        }
        // every rank's parameters as they are (what a gather that does not happen leaves), then the
        // updated shards over them
        Tensor all({d * f.shard}, first.dtype(), first.device());
        for (const Span& s : f.spans) {
            Tensor dst = all.narrow(0, s.offset, s.numel);
            be_.copy(flat_view(s.p->value), dst);
        }
        {
            CommScope scope(dp_.counter().get(), f.root, CommSite::of_zero_params(f.index));
            dp_.all_gather(mine, all);
        }
        all_gather_bytes_ += static_cast<int64_t>(all.nbytes());
        for (const Span& s : f.spans) {
            Tensor dst = flat_view(s.p->value);
            be_.copy(all.narrow(0, s.offset, s.numel), dst);
        }
    }
}

void ZeroOptimizer::gather_gradients() {
    if (stage_ != 2) return;
    const int d = dp_.size();
    for (const Flat& f : flats_) {
        if (f.spans.empty()) continue;
        Tensor all({d * f.shard}, f.grad_shard.dtype(), f.grad_shard.device());
        dp_.all_gather(f.grad_shard, all);
        for (const Span& s : f.spans) {
            s.p->grad = Tensor(s.p->value.shape(), f.grad_shard.dtype(), s.p->value.device());
            Tensor dst = flat_view(s.p->grad);
            be_.copy(all.narrow(0, s.offset, s.numel), dst);
        }
    }
}

}  // namespace ptool
