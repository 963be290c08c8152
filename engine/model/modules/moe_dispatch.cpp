// A moe layer's expert-parallel dispatch and combine (model/moe.h, parallel/expert_parallel.h).
#include "comm/comm_stats.h"
#include "comm/communicator.h"
#include "model/modules/moe_rows.h"
#include "model/moe.h"

namespace ptool {

using namespace moe_rows;

// Expert parallel (parallel/expert_parallel.h). The send rows are this rank's slots expert by expert
// (so owner by owner, the owners' blocks being contiguous); the counts per expert go first, so each
// owner knows where each of its experts' rows sit among those it receives (rank-major).
void Moe::dispatched_forward(RunContext& ctx, const Placed& x, Saved& sv, Tensor& out,
                             const Observer& observer) {
    Backend& be = *ctx.backend;
    Communicator& ep = *ctx.ep;
    const Device dev = x.t.device();
    const DType dt = x.t.dtype();
    const int64_t d = o_.dim, k = o_.router.top_k, experts = o_.router.experts;
    const int P = ep.size(), me = ep.rank();
    const int64_t L = experts / P;
    const Tensor x2 = x.t.reshape({x.t.numel() / d, d});
    Dispatch& dp = sv.ep;
    std::vector<double> ids, w;
    std::vector<int64_t> per_position(static_cast<size_t>(experts));
    dp.offset.assign(static_cast<size_t>(experts), 0);
    for (int j = 0; j < P; ++j)  // the send rows: rank j's experts' rows, its l-th expert's before its l+1-th
        for (int64_t l = 0; l < L; ++l) {
            const int64_t e = dispatch_->sent_as(j, l, L, P);
            const std::vector<int64_t>& slots = sv.routing.slots[static_cast<size_t>(e)];
            dp.offset[static_cast<size_t>(e)] = static_cast<int64_t>(dp.slots.size());
            per_position[static_cast<size_t>(j * L + l)] = static_cast<int64_t>(slots.size());
            dp.slots.insert(dp.slots.end(), slots.begin(), slots.end());
            if (dev != Device::meta)  // (meta: the shapes only)
                for (int64_t s : slots) {
                    ids.push_back(static_cast<double>(s / k));
                    w.insert(w.end(), static_cast<size_t>(d), sv.routing.weights[static_cast<size_t>(s)]);
                }
        }
    dispatch_->count(per_position, L);
    std::vector<double> per_expert(per_position.begin(), per_position.end());
    dp.send_rows.assign(static_cast<size_t>(P), 0);
    for (int64_t i = 0; i < experts; ++i)
        dp.send_rows[static_cast<size_t>(i / L)] += per_position[static_cast<size_t>(i)];
    const int64_t S = static_cast<int64_t>(dp.slots.size());
    std::vector<int64_t> counts(static_cast<size_t>(P * L));  // [source][owned expert]: its rows
    CommScope scope(ep.counter().get(), fqn(), {CommSiteKind::expert_dispatch});
    {
        Tensor mine = device_tensor({experts}, DType::int64, dev, per_expert),
               theirs({experts}, DType::int64, dev);
        ep.all_to_all(mine, theirs);
        const std::vector<double> got = dev == Device::meta ? std::vector<double>() : host_values(theirs);
        for (int s = 0; s < P; ++s)  // on meta every rank routes as this one (balanced routing)
            for (int64_t l = 0; l < L; ++l)
                counts[static_cast<size_t>(s * L + l)] =
                    static_cast<int64_t>(dev == Device::meta ? per_expert[static_cast<size_t>(me * L + l)]
                                                             : got[static_cast<size_t>(s * L + l)]);
    }
    dp.recv_rows.assign(static_cast<size_t>(P), 0);
    for (int s = 0; s < P; ++s)
        for (int64_t l = 0; l < L; ++l)
            dp.recv_rows[static_cast<size_t>(s)] += counts[static_cast<size_t>(s * L + l)];
    int64_t R = 0;
    for (int64_t r : dp.recv_rows) R += r;
    dp.ids = device_tensor({S}, DType::int64, dev, ids);
    dp.weights = device_tensor({S, d}, dt, dev, w);
    if (!dispatch_->inverts()) std::sort(ids.begin(), ids.end());  // the rows left in token order
    dp.combine_ids = dispatch_->inverts() ? dp.ids : device_tensor({S}, DType::int64, dev, ids);
    Tensor xs = Tensor::empty({S, d}, dt, dev), xr = Tensor::empty({R, d}, dt, dev);
    if (S) be.embedding(dp.ids, x2, xs);
    ep.all_to_all_v(xs, dp.send_rows, xr, dp.recv_rows);
    Tensor yr({R, d}, dt, dev);
    for (int64_t l = 0; l < L; ++l) {  // each owned expert once, on every rank's rows for it
        std::vector<double> rows;
        int64_t base = 0;
        for (int s = 0; s < P; ++s) {
            int64_t at = base;
            for (int64_t j = 0; j < l; ++j) at += counts[static_cast<size_t>(s * L + j)];
            for (int64_t i = 0; i < counts[static_cast<size_t>(s * L + l)]; ++i)
                rows.push_back(static_cast<double>(at + i));
            base += dp.recv_rows[static_cast<size_t>(s)];
        }
        const int64_t m = static_cast<int64_t>(rows.size());
        const Tensor oid = device_tensor({m}, DType::int64, dev, rows);
        Tensor xe = Tensor::empty({1, m, d}, dt, dev);
        if (m) be.embedding(oid, xr, xe);
        const Placed ye = expert(me * L + l).forward(ctx, Placed(xe));
        if (m) be.embedding_backward(oid, ye.t.reshape({m, d}), yr);
        dp.owned_ids.push_back(oid);
    }
    dp.outputs = Tensor::empty({S, d}, dt, dev);
    ep.all_to_all_v(yr, dp.recv_rows, dp.outputs, dp.send_rows);
    Tensor weighted = Tensor::empty({S, d}, dt, dev);
    be.mul(dp.outputs, dp.weights, weighted);
    if (S) be.embedding_backward(dp.combine_ids, weighted, out);
    if (!observer) return;
    for (int64_t e = 0; e < experts; ++e) {
        const ExpertRows r = expert_rows(sv.routing, e, k, d, dt, dev);
        observer(expert(e).fqn(), Phase::forward, ctx.microbatch,
                 at_tokens(be, r, dp.outputs.narrow(0, dp.offset[static_cast<size_t>(e)], r.n), x));
    }
}

void Moe::dispatched_backward(RunContext& ctx, const Placed& dy, Saved& sv, Tensor& dx,
                              std::vector<double>& d_weights, const Observer& observer) {
    Backend& be = *ctx.backend;
    Communicator& ep = *ctx.ep;
    const Device dev = dy.t.device();
    const DType dt = dy.t.dtype();
    const int64_t d = o_.dim, k = o_.router.top_k, experts = o_.router.experts;
    const int me = ep.rank();
    const int64_t L = experts / ep.size();
    const Tensor dy2 = dy.t.reshape({dy.t.numel() / d, d});
    Dispatch& dp = sv.ep;
    const int64_t S = static_cast<int64_t>(dp.slots.size());
    int64_t R = 0;
    for (int64_t r : dp.recv_rows) R += r;
    Tensor dys = Tensor::empty({S, d}, dt, dev), dins = Tensor::empty({S, d}, dt, dev);
    if (S) be.embedding(dp.combine_ids, dy2, dys);
    const std::vector<double> dw = row_dots(be, dys, dp.outputs, S, d);
    for (int64_t i = 0; i < S; ++i)
        d_weights[static_cast<size_t>(dp.slots[static_cast<size_t>(i)])] =
            dev == Device::meta ? 0.0 : dw[static_cast<size_t>(i)];
    be.mul(dys, dp.weights, dins);
    CommScope scope(ep.counter().get(), fqn(), {CommSiteKind::expert_dispatch});
    Tensor dinr = Tensor::empty({R, d}, dt, dev), dxr({R, d}, dt, dev), dxs = Tensor::empty({S, d}, dt, dev);
    ep.all_to_all_v(dins, dp.send_rows, dinr, dp.recv_rows);
    for (int64_t l = L - 1; l >= 0; --l) {
        const Tensor& oid = dp.owned_ids[static_cast<size_t>(l)];
        const int64_t m = oid.numel();
        Tensor din = Tensor::empty({1, m, d}, dt, dev);
        if (m) be.embedding(oid, dinr, din);
        const Placed dxe = expert(me * L + l).backward(ctx, Placed(din));
        if (m) be.embedding_backward(oid, dxe.t.reshape({m, d}), dxr);
    }
    ep.all_to_all_v(dxr, dp.recv_rows, dxs, dp.send_rows);
    if (S) be.embedding_backward(dp.ids, dxs, dx);
    if (!observer) return;
    for (int64_t e = 0; e < experts; ++e) {
        const ExpertRows r = expert_rows(sv.routing, e, k, d, dt, dev);
        observer(expert(e).fqn(), Phase::backward, ctx.microbatch,
                 at_tokens(be, r, dxs.narrow(0, dp.offset[static_cast<size_t>(e)], r.n), dy));
    }
}

}  // namespace ptool
