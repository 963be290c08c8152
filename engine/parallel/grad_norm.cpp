#include "parallel/grad_norm.h"

#include <cmath>

namespace ptool {

double clip_grad_norm(const GradNormInputs& in, double max_norm, Communicator& tp, Communicator& dp, Backend& be) {
    const int64_t n = static_cast<int64_t>(in.params.size());
    Tensor on_tp({n}, DType::float64), whole({n}, DType::float64);  // squares of the pieces sharded on tp, and the rest
    for (int64_t i = 0; i < n; ++i) {
        const Tensor& g = in.params[i].second->grad;
        if (g.device() == Device::meta) continue;  // a simulated step: the collectives, no values
        const Tensor host = g.device() == Device::cpu ? g : g.to_device(Device::cpu);
        double sq = 0;
        for (double v : host.to_doubles()) sq += v * v;
        (in.sharded_on_tp(in.params[i].second.get()) ? on_tp : whole).set(i, sq);
    }
    auto counter = tp.counter();
    CommScope scope(counter.get(), "(clip)", "clip_grad_norm");
    if (tp.size() > 1) tp.all_reduce(on_tp, ReduceOp::sum);
    Tensor on_dp({n}, DType::float64), rest({n}, DType::float64);
    for (int64_t i = 0; i < n; ++i) {
        const double sq = on_tp.item(i) + whole.item(i);
        (in.sharded_on_dp(in.params[i].second.get()) ? on_dp : rest).set(i, sq);
    }
    if (dp.size() > 1) dp.all_reduce(on_dp, ReduceOp::sum);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += on_dp.item(i) + rest.item(i);
    const double norm = std::sqrt(total);
    const double coef = std::min(1.0, max_norm / (norm + 1e-6));
    if (coef < 1.0)
        for (const auto& [name, p] : in.params) be.scale(p->grad, coef, p->grad);
    return norm;
}

std::vector<std::pair<const char*, int64_t>> clip_grad_norm_cost(int64_t params, int tp, int dp) {
    std::vector<std::pair<const char*, int64_t>> out;
    if (tp > 1) out.push_back({"all_reduce", params * 8});
    if (dp > 1) out.push_back({"all_reduce", params * 8});
    return out;
}

}  // namespace ptool
