#include "comm/comm_stats.h"

namespace ptool {

void CommCounter::add(Collective op, const std::string& mesh_dim, int64_t bytes) {
    if (paused_) return;
    CommTotals& t = by_key_[{op, mesh_dim, module_}];
    t.calls += 1;
    t.bytes += bytes;
}

std::map<Collective, CommTotals> CommCounter::by_op() const {
    std::map<Collective, CommTotals> out;
    for (const auto& [key, t] : by_key_) {
        CommTotals& o = out[std::get<0>(key)];
        o.calls += t.calls;
        o.bytes += t.bytes;
    }
    return out;
}

CommTotals CommCounter::total() const {
    CommTotals out;
    for (const auto& [key, t] : by_key_) out.calls += t.calls, out.bytes += t.bytes;
    return out;
}

CommByOpDim by_op_dim(const CommCounter& comm) {
    CommByOpDim out;
    for (const auto& [key, totals] : comm.entries()) {
        CommTotals& o = out[{std::get<0>(key), std::get<1>(key)}];
        o.calls += totals.calls, o.bytes += totals.bytes;
    }
    return out;
}

CommByOpDim comm_since(const CommByOpDim& before, const CommByOpDim& after) {
    CommByOpDim out;
    for (const auto& [key, t] : after) {
        CommTotals d = t;
        if (auto it = before.find(key); it != before.end())
            d.calls -= it->second.calls, d.bytes -= it->second.bytes;
        if (d.calls != 0 || d.bytes != 0) out[key] = d;
    }
    return out;
}

CommByOpDim comm_extrapolated(const CommByOpDim& a, const CommByOpDim& b, double k) {
    auto lin = [k](double x, double y) { return x + (y - x) * k; };
    CommByOpDim out;
    for (const auto* src : {&a, &b})
        for (const auto& [key, t] : *src) out[key];
    for (auto& [key, t] : out) {
        const CommTotals x = a.count(key) ? a.at(key) : CommTotals{},
                         y = b.count(key) ? b.at(key) : CommTotals{};
        t.calls = static_cast<int64_t>(lin(x.calls, y.calls));
        t.bytes = static_cast<int64_t>(lin(x.bytes, y.bytes));
    }
    return out;
}

}  // namespace ptool
