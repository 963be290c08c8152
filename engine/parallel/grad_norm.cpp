#include "parallel/grad_norm.h"

#include <algorithm>
#include <cmath>

namespace ptool {

double clip_grad_norm(const GradNormInputs& in, double max_norm, Backend& be) {
    const int64_t n = static_cast<int64_t>(in.params.size());
    std::vector<double> sq(n, 0.0);  // per parameter: the squares of this rank's piece, then of more pieces
    auto grads = [&](const Parameter* p) { return in.grads ? in.grads(p) : std::vector<Tensor>{p->grad}; };
    for (int64_t i = 0; i < n; ++i)
        for (const Tensor& g : grads(in.params[i].second.get())) {
            if (g.device() == Device::meta) continue;  // a simulated step: the collectives, no values
            const Tensor host = g.device() == Device::cpu ? g : g.to_device(Device::cpu);
            for (double v : host.to_doubles()) sq[i] += v * v;
        }
    std::vector<Tensor> kept;  // each dim's pair lives to the end, as the whole computation's
    for (const GradNormInputs::Dim& d : in.dims) {
        Tensor on({n}, DType::float64),
            rest({n}, DType::float64);  // squares of the pieces sharded on d, and the rest
        for (int64_t i = 0; i < n; ++i)
            (in.placements(in.params[i].second.get()).on(d.mesh_dim).splits() ? on : rest).set(i, sq[i]);
        if (d.comm->size() > 1) {
            CommScope scope(d.comm->counter().get(), "(clip)", CommSiteKind::clip_grad_norm);
            d.comm->all_reduce(on, ReduceOp::sum);
        }
        for (int64_t i = 0; i < n; ++i) sq[i] = on.item(i) + rest.item(i);
        kept.push_back(std::move(on)), kept.push_back(std::move(rest));
    }
    if (in.stages && in.stages->size() > 1) {  // every stage's squares, in stage order
        CommScope scope(in.stages->counter().get(), "(clip)", CommSiteKind::clip_grad_norm);
        const int k = in.stages->size();
        std::vector<double> own;  // the squares this stage counts, in its parameters' order
        for (int64_t i = 0; i < n; ++i)
            if (!in.counted || in.counted(in.params[i].second.get())) own.push_back(sq[i]);
        const int64_t c = static_cast<int64_t>(own.size());
        Tensor count = Tensor::scalar(static_cast<double>(c), DType::int64).reshape({1}),
               counts({k}, DType::int64);
        {
            CountingPaused pause(in.stages->counter().get());  // the sizes are metadata
            in.stages->all_gather(count, counts);
        }
        int64_t all = 0;
        for (int r = 0; r < k; ++r) all += static_cast<int64_t>(counts.item(r));
        Tensor mine({c}, DType::float64), every({all}, DType::float64);
        for (int64_t i = 0; i < c; ++i) mine.set(i, own[i]);
        in.stages->all_gather(mine, every);
        sq = every.to_doubles();
        if (in.order) {  // each square's place in the model's order, gathered alike (metadata)
            Tensor keys({c}, DType::int64), all_keys({all}, DType::int64);
            int64_t j = 0;
            for (int64_t i = 0; i < n; ++i)
                if (!in.counted || in.counted(in.params[i].second.get()))
                    keys.set(j++, static_cast<double>(in.order(in.params[i].second.get())));
            {
                CountingPaused pause(in.stages->counter().get());
                in.stages->all_gather(keys, all_keys);
            }
            std::vector<std::pair<int64_t, double>> placed;
            for (int64_t i = 0; i < all; ++i)
                placed.push_back({static_cast<int64_t>(all_keys.item(i)), sq[i]});
            std::sort(placed.begin(), placed.end());
            for (int64_t i = 0; i < all; ++i) sq[i] = placed[i].second;
        }
    }
    double total = 0;
    for (double v : sq) total += v;
    const double norm = in.norm_used ? in.norm_used(std::sqrt(total)) : std::sqrt(total);
    const double coef = std::min(1.0, max_norm / (norm + 1e-6));
    if (coef < 1.0)
        for (const auto& [name, p] : in.params)
            for (Tensor g : grads(p.get())) be.scale(g, coef, g);
    return norm;
}

std::vector<std::pair<Collective, int64_t>> clip_grad_norm_cost(int64_t params,
                                                                const std::vector<int>& dims) {
    std::vector<std::pair<Collective, int64_t>> out;
    for (int size : dims)
        if (size > 1) out.push_back({Collective::all_reduce, params * 8});
    return out;
}

}  // namespace ptool
