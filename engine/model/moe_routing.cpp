#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ptool {

void assign_slots(const RouterOptions& o, Routing& r) {
    r.slots.assign(static_cast<size_t>(o.experts), {});
    for (int64_t s = 0; s < r.tokens * o.top_k; ++s) r.slots[static_cast<size_t>(r.chosen[s])].push_back(s);
}

Routing route(const RouterOptions& o, const std::vector<double>& logits, const std::vector<double>& bias) {
    const int64_t e = o.experts, k = o.top_k;
    Routing r;
    r.tokens = static_cast<int64_t>(logits.size()) / e;
    r.scores.resize(logits.size());
    r.chosen.resize(static_cast<size_t>(r.tokens * k));
    r.weights.resize(static_cast<size_t>(r.tokens * k));
    std::vector<int64_t> order(static_cast<size_t>(e));
    for (int64_t n = 0; n < r.tokens; ++n) {
        const double* x = logits.data() + n * e;
        double* s = r.scores.data() + n * e;
        if (o.score == RouterScore::softmax) {
            const double mx = *std::max_element(x, x + e);
            double sum = 0;
            for (int64_t i = 0; i < e; ++i) sum += s[i] = std::exp(x[i] - mx);
            for (int64_t i = 0; i < e; ++i) s[i] /= sum;
        } else {
            for (int64_t i = 0; i < e; ++i) s[i] = 1.0 / (1.0 + std::exp(-x[i]));
        }
        auto key = [&](int64_t i) { return s[i] + (bias.empty() ? 0.0 : bias[static_cast<size_t>(i)]); };
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) > key(b); });
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += s[order[static_cast<size_t>(j)]];
        for (int64_t j = 0; j < k; ++j) {
            const int64_t c = order[static_cast<size_t>(j)];
            r.chosen[static_cast<size_t>(n * k + j)] = c;
            r.weights[static_cast<size_t>(n * k + j)] = (o.norm_topk_prob ? s[c] / sum : s[c]) * o.scaling;
        }
    }
    assign_slots(o, r);
    return r;
}

Routing balanced_routing(const RouterOptions& o, int64_t tokens) {
    Routing r;
    r.tokens = tokens;
    r.chosen.resize(static_cast<size_t>(tokens * o.top_k));
    r.weights.assign(r.chosen.size(), 1.0 / static_cast<double>(o.top_k));
    for (int64_t s = 0; s < tokens * o.top_k; ++s) r.chosen[static_cast<size_t>(s)] = s % o.experts;
    assign_slots(o, r);
    return r;
}

std::vector<double> route_backward(const RouterOptions& o, const Routing& r,
                                   const std::vector<double>& d_weights) {
    const int64_t e = o.experts, k = o.top_k;
    std::vector<double> d_logits(static_cast<size_t>(r.tokens * e), 0.0);
    if (r.scores.empty()) return d_logits;  // balanced routing (meta): nothing to differentiate
    std::vector<double> ds(static_cast<size_t>(e));
    for (int64_t n = 0; n < r.tokens; ++n) {
        const double* s = r.scores.data() + n * e;
        const int64_t* c = r.chosen.data() + n * k;
        const double* dw = d_weights.data() + n * k;
        std::fill(ds.begin(), ds.end(), 0.0);
        // w_j = scaling * s_cj / S (S = the chosen scores' sum; 1 without renormalising):
        // ds_cj = scaling * (dw_j - sum_i dw_i s_ci / S) / S
        double sum = 0, dot = 0;
        for (int64_t j = 0; j < k; ++j) sum += s[c[j]];
        for (int64_t j = 0; j < k; ++j) dot += dw[j] * s[c[j]];
        for (int64_t j = 0; j < k; ++j)
            ds[static_cast<size_t>(c[j])] =
                o.norm_topk_prob ? o.scaling * (dw[j] - dot / sum) / sum : o.scaling * dw[j];
        double* dl = d_logits.data() + n * e;
        if (o.score == RouterScore::softmax) {  // dl = s (ds - sum(s ds))
            double sds = 0;
            for (int64_t i = 0; i < e; ++i) sds += s[i] * ds[static_cast<size_t>(i)];
            for (int64_t i = 0; i < e; ++i) dl[i] = s[i] * (ds[static_cast<size_t>(i)] - sds);
        } else {  // dl = ds s (1 - s)
            for (int64_t i = 0; i < e; ++i) dl[i] = ds[static_cast<size_t>(i)] * s[i] * (1 - s[i]);
        }
    }
    return d_logits;
}

bool near_tie(const RouterOptions& o, const Routing& r, int64_t n, const std::vector<double>& logits,
              const std::vector<double>& bias, double rtol, double atol) {
    const int64_t e = o.experts, k = o.top_k;
    if (k >= e) return false;
    const double* l = logits.data() + n * e;
    const double* s = r.scores.data() + n * e;
    std::vector<double> tol(static_cast<size_t>(e));
    double most = 0;
    for (int64_t i = 0; i < e; ++i)
        most = std::max(most, tol[static_cast<size_t>(i)] = atol + rtol * std::abs(l[i]));
    auto b = [&](int64_t i) { return bias.empty() ? 0.0 : bias[static_cast<size_t>(i)]; };
    auto key = [&](int64_t i, double sign) {  // the key's bound with the logit moved by sign x tol
        const double t = tol[static_cast<size_t>(i)];
        if (o.score == RouterScore::sigmoid) return 1.0 / (1.0 + std::exp(-(l[i] + sign * t))) + b(i);
        if (bias.empty()) return l[i] + sign * t;
        return s[i] * std::exp(sign * (t + most)) + b(i);
    };
    std::vector<uint8_t> chosen(static_cast<size_t>(e), 0);
    for (int64_t j = 0; j < k; ++j) chosen[static_cast<size_t>(r.chosen[static_cast<size_t>(n * k + j)])] = 1;
    double lowest = std::numeric_limits<double>::infinity(), highest = -lowest;
    for (int64_t i = 0; i < e; ++i)
        if (chosen[static_cast<size_t>(i)])
            lowest = std::min(lowest, key(i, -1));
        else
            highest = std::max(highest, key(i, +1));
    return lowest <= highest;
}

void force_choice(const Router& router, const RouterOptions& o, Routing& r, int64_t n,
                  const std::vector<double>& logits, const std::vector<double>& bias, const int64_t* chosen) {
    const int64_t e = o.experts, k = o.top_k;
    std::vector<double> row(logits.begin() + n * e, logits.begin() + (n + 1) * e);
    std::vector<double> forced = bias.empty() ? std::vector<double>(static_cast<size_t>(e), 0.0) : bias;
    for (int64_t j = 0; j < k; ++j)
        forced[static_cast<size_t>(chosen[j])] += 1e6;  // keys within [-1, 2] + bias
    Routing one = router.route(o, row, forced);
    std::copy(one.scores.begin(), one.scores.end(), r.scores.begin() + n * e);
    std::copy(one.chosen.begin(), one.chosen.end(), r.chosen.begin() + n * k);
    std::copy(one.weights.begin(), one.weights.end(), r.weights.begin() + n * k);
}

}  // namespace ptool
