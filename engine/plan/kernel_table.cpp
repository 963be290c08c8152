#include "plan/kernel_table.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/files.h"
#include "core/json_reader.h"

namespace ptool {
namespace {

constexpr const char* kFormat = "ptool kernel table 1";

// An object's members, each key one of `keys` (a misspelt key is refused, not ignored).
void only_keys(const JsonNode& n, const std::string& what, std::initializer_list<const char*> keys) {
    for (const auto& [key, value] : n.members(what)) {
        bool known = false;
        for (const char* k : keys) known = known || key == k;
        if (!known) {
            std::vector<std::string> names(keys.begin(), keys.end());
            throw InputError(value.key_where(), fmt::format("unknown key '{}' in {} (valid: {})", key, what,
                                                            fmt::join(names, ", ")));
        }
    }
}

// A measured row's rate against the table's peak: not over twice it (no kernel beats its device's
// peak: a time of 5e-324 s priced the GEMMs at 0). No floor: a tiny kernel's launch dominates its
// time (a 1 x 1 x 1 GEMM runs at a billionth of the peak). `key` names the row's time.
void check_rate(const JsonNode& row, const std::string& key, const std::string& what, double rate,
                double peak, const char* unit, double scale) {
    if (peak <= 0 || rate <= 2 * peak) return;
    row.at(key).fail(fmt::format("{} of {} implies {:.4g} {}, over twice the table's peak of {:.4g}", key,
                                 what, rate / scale, unit, peak / scale));
}

double positive(const JsonNode& n, const std::string& key, const std::string& what) {
    const JsonNode v = n.at(key);
    const double x = v.as_number(fmt::format("'{}' of {}", key, what));
    if (!(x > 0) || x > 1e30)
        v.fail(fmt::format("'{}' of {} must be a positive number, got {:g}", key, what, x));
    return x;
}

int64_t size(const JsonNode& n, const std::string& key, const std::string& what) {
    return n.at(key).as_positive_int(fmt::format("'{}' of {}", key, what));
}

DType dtype_of(const JsonNode& n, const std::string& what) {
    const JsonNode v = n.at("dtype");
    const std::string name = v.as_string(fmt::format("'dtype' of {}", what));
    if (name != "bfloat16" && name != "float16" && name != "float32" && name != "float64")
        v.fail(
            fmt::format("'dtype' of {} must be bfloat16, float16, float32 or float64, got '{}'", what, name));
    return parse_dtype(name);
}

GemmOp gemm_op(const JsonNode& n, const std::string& what) {
    const JsonNode v = n.at("op");
    const std::string name = v.as_string(fmt::format("'op' of {}", what));
    for (GemmOp op : {GemmOp::fwd, GemmOp::dgrad, GemmOp::wgrad})
        if (name == gemm_op_name(op)) return op;
    v.fail(fmt::format("'op' of {} must be fwd, dgrad or wgrad, got '{}'", what, name));
}

void load_peak(const JsonNode& p, KernelTable& t) {
    only_keys(p, "'peak'", {"tflops", "memory_bandwidth_gb_s"});
    const JsonNode f = p.at("tflops");
    for (const auto& [key, value] : f.members("'tflops' of 'peak'")) {
        DType dt = DType::float32;
        if (key != "float8") {  // float8: the float8 rows' (torch._scaled_mm's tensor cores)
            try {
                dt = parse_dtype(key);
            } catch (const std::exception&) {
                throw InputError(
                    value.key_where(),
                    fmt::format("'{}' is not a dtype (bfloat16, float16, float32, float64) nor float8", key));
            }
        }
        const double x = value.as_number(fmt::format("'tflops' of {}", key));
        if (!(x > 0) || x > 1e6)
            value.fail(fmt::format("'tflops' of {} must be in (0, 1e6], got {:g}", key, x));
        (key == "float8" ? t.float8_peak_flops : t.peak_flops[dt]) = x * 1e12;
    }
    t.peak_bandwidth = positive(p, "memory_bandwidth_gb_s", "'peak'") * 1e9;
}

void load_rows(const JsonNode& root, KernelTable& t) {
    const auto gemm = root.at("gemm").items("'gemm'");
    if (gemm.empty()) root.at("gemm").fail("'gemm' has no rows: a kernel table measures at least one GEMM");
    std::set<GemmKey> seen;
    for (const JsonNode& r : gemm) {
        const std::string what = "a 'gemm' row";
        only_keys(r, what, {"dtype", "float8", "op", "m", "n", "k", "seconds"});
        KernelTable::Gemm g{
            {gemm_op(r, what), dtype_of(r, what), size(r, "m", what), size(r, "n", what), size(r, "k", what)},
            positive(r, "seconds", what)};
        if (auto f = r.get("float8")) {  // torch._scaled_mm's, `dtype` its output's
            const std::string recipe = f->as_string("'float8' of " + what);
            if (recipe != "tensorwise")
                f->fail(fmt::format("'float8' of {} must be tensorwise, got '{}'", what, recipe));
            g.key.float8 = true;
        }
        if (!seen.insert(g.key).second)
            r.fail("a second 'gemm' row of the same dtype, float8, op, m, n and k");
        const double peak = g.key.float8                      ? t.float8_peak_flops
                            : t.peak_flops.count(g.key.dtype) ? t.peak_flops.at(g.key.dtype)
                                                              : 0;  // (no peak: refused below)
        check_rate(r, "seconds", what,
                   2.0 * static_cast<double>(g.key.m) * static_cast<double>(g.key.n) *
                       static_cast<double>(g.key.k) / g.seconds,
                   peak, "TFLOP/s", 1e12);
        t.gemm.push_back(g);
    }
    // float8 rows price only float8 GEMMs: every other GEMM (the output head's, the attention's, the
    // backward's of a plan without float8) needs rows of a compute dtype (gemm_dtype_for)
    if (std::all_of(t.gemm.begin(), t.gemm.end(), [](const KernelTable::Gemm& g) { return g.key.float8; }))
        root.at("gemm").fail(
            "'gemm' has float8 rows only: a kernel table measures GEMMs of a compute dtype too (bfloat16, "
            "float16, float32 or float64), which price every GEMM that is not float8");
    for (const KernelTable::Gemm& g : t.gemm)  // every measured dtype's rows scale by its peak
        if (g.key.float8 && t.float8_peak_flops <= 0)
            root.at("peak").fail(
                "'peak' gives no 'tflops' for float8, which the 'gemm' rows marked float8 measure");
        else if (!t.peak_flops.count(g.key.dtype))
            root.at("peak").fail(fmt::format("'peak' gives no 'tflops' for {}, which 'gemm' measures",
                                             dtype_name(g.key.dtype)));
    if (auto a = root.get("attention"))
        for (const JsonNode& r : a->items("'attention'")) {
            const std::string what = "an 'attention' row";
            only_keys(r, what,
                      {"dtype", "causal", "batch", "heads", "kv_heads", "seq", "head_dim", "fwd_seconds",
                       "fwd_bwd_seconds"});
            KernelTable::Attention x;
            x.dtype = dtype_of(r, what);
            x.causal = r.at("causal").as_bool("'causal' of " + what);
            x.batch = size(r, "batch", what), x.heads = size(r, "heads", what);
            x.kv_heads = size(r, "kv_heads", what), x.seq = size(r, "seq", what);
            x.head_dim = size(r, "head_dim", what);
            x.fwd_seconds = positive(r, "fwd_seconds", what);
            x.fwd_bwd_seconds = positive(r, "fwd_bwd_seconds", what);
            if (x.heads % x.kv_heads != 0) r.at("kv_heads").fail("'kv_heads' must divide 'heads'");
            if (!t.peak_flops.count(x.dtype))
                r.at("dtype").fail(fmt::format("'peak' gives no 'tflops' for {}, which this row measures",
                                               dtype_name(x.dtype)));
            if (x.fwd_bwd_seconds <= x.fwd_seconds)
                r.at("fwd_bwd_seconds").fail("'fwd_bwd_seconds' must be more than 'fwd_seconds'");
            check_rate(r, "fwd_seconds", what, x.fwd_flops() / x.fwd_seconds, t.peak_flops.at(x.dtype),
                       "TFLOP/s", 1e12);
            t.attention.push_back(x);
        }
    for (const JsonNode& r : root.at("memory").items("'memory'")) {
        const std::string what = "a 'memory' row";
        only_keys(r, what, {"op", "dtype", "elements", "bytes", "seconds"});
        KernelTable::MemoryOp m;
        m.op = r.at("op").as_string("'op' of " + what);
        m.dtype = dtype_of(r, what);
        m.elements = positive(r, "elements", what);
        m.bytes = positive(r, "bytes", what);
        m.seconds = positive(r, "seconds", what);
        check_rate(r, "seconds", what, m.bytes / m.seconds, t.peak_bandwidth, "GB/s", 1e9);
        if (t.memory_op(m.op, m.dtype))
            r.fail(fmt::format("a second 'memory' row of op '{}' in {}", m.op, dtype_name(m.dtype)));
        t.memory.push_back(m);
    }
    if (std::none_of(t.memory.begin(), t.memory.end(), [](const auto& m) { return m.op == "copy"; }))
        root.at("memory").fail(
            "'memory' has no 'copy' row: the streaming bandwidth every derived op is priced at");
}

// The corners of a log-space grid cell and their weights, per axis: the bracket of x in the sorted
// values and x's place between them (0 at the lower); outside the range both ends are the edge.
struct Bracket {
    size_t lo = 0, hi = 0;
    double t = 0;
    double below = 1;  // x over the smallest value, when x is below the range (else 1)
};
Bracket bracket(const std::vector<int64_t>& values, double x) {
    Bracket b;
    if (x <= static_cast<double>(values.front())) {
        b.below = x / static_cast<double>(values.front());
        return b;
    }
    if (x >= static_cast<double>(values.back())) {
        b.lo = b.hi = values.size() - 1;
        return b;
    }
    const size_t hi = static_cast<size_t>(
        std::upper_bound(values.begin(), values.end(), static_cast<int64_t>(x)) - values.begin());
    b.lo = hi - 1, b.hi = std::min(hi, values.size() - 1);
    if (b.lo == b.hi) return b;
    const double l0 = std::log(static_cast<double>(values[b.lo])),
                 l1 = std::log(static_cast<double>(values[b.hi]));
    b.t = (std::log(x) - l0) / (l1 - l0);
    return b;
}

std::vector<int64_t> distinct(std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
}

}  // namespace

double KernelTable::Attention::fwd_flops() const {
    const double s = static_cast<double>(seq);
    return 4.0 * static_cast<double>(batch) * static_cast<double>(heads) * s * s *
           static_cast<double>(head_dim) * (causal ? 0.5 : 1.0);
}

DType KernelTable::gemm_dtype_for(DType dt) const {
    if (has_gemm(dt)) return dt;
    if (has_gemm(DType::bfloat16)) return DType::bfloat16;
    return gemm.front().key.dtype;
}

bool KernelTable::has_gemm(DType dt) const {
    return std::any_of(gemm.begin(), gemm.end(),
                       [&](const Gemm& g) { return g.key.dtype == dt && !g.key.float8; });
}

bool KernelTable::has_float8_gemm(DType dt) const {
    return std::any_of(gemm.begin(), gemm.end(),
                       [&](const Gemm& g) { return g.key.dtype == dt && g.key.float8; });
}

double KernelTable::gemm_seconds(const GemmKey& q) const {
    std::vector<const Gemm*> rows;
    std::vector<int64_t> ms, ns, ks;
    // a float8 GEMM at the float8 rows where the table has them, else at its output dtype's
    const bool float8 = q.float8 && has_float8_gemm(q.dtype);
    for (const Gemm& g : gemm)
        if (g.key.dtype == q.dtype && g.key.float8 == float8 && g.key.op == q.op)
            rows.push_back(&g), ms.push_back(g.key.m), ns.push_back(g.key.n), ks.push_back(g.key.k);
    if (rows.empty())  // the op unmeasured for this dtype: the dtype's other layouts
        for (const Gemm& g : gemm)
            if (g.key.dtype == q.dtype && g.key.float8 == float8)
                rows.push_back(&g), ms.push_back(g.key.m), ns.push_back(g.key.n), ks.push_back(g.key.k);
    PTOOL_REQUIRE(!rows.empty(), "no GEMM rows of {} in {}", dtype_name(q.dtype), path);
    ms = distinct(ms), ns = distinct(ns), ks = distinct(ks);
    const double flops = 2.0 * static_cast<double>(q.m) * static_cast<double>(q.n) * static_cast<double>(q.k);
    if (flops <= 0) return 0;
    const Bracket bm = bracket(ms, static_cast<double>(q.m)), bn = bracket(ns, static_cast<double>(q.n)),
                  bk = bracket(ks, static_cast<double>(q.k));
    auto rate_at = [&](int64_t m, int64_t n, int64_t k) -> double {
        for (const Gemm* g : rows)
            if (g->key.m == m && g->key.n == n && g->key.k == k)
                return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
                       g->seconds;
        return 0;
    };
    double weight = 0, log_rate = 0;
    for (int c = 0; c < 8; ++c) {
        const size_t im = c & 1 ? bm.hi : bm.lo, in = c & 2 ? bn.hi : bn.lo, ik = c & 4 ? bk.hi : bk.lo;
        const double w = (c & 1 ? bm.t : 1 - bm.t) * (c & 2 ? bn.t : 1 - bn.t) * (c & 4 ? bk.t : 1 - bk.t);
        if (w <= 0) continue;
        const double r = rate_at(ms[im], ns[in], ks[ik]);
        if (r <= 0) continue;  // a corner the rows do not measure
        weight += w, log_rate += w * std::log(r);
    }
    double rate;
    if (weight > 0) {
        rate = std::exp(log_rate / weight);
    } else {  // a scattered table: the nearest row in log space
        const Gemm* best = nullptr;
        double best_d = 0;
        for (const Gemm* g : rows) {
            const double d = std::pow(std::log(static_cast<double>(g->key.m) / static_cast<double>(q.m)), 2) +
                             std::pow(std::log(static_cast<double>(g->key.n) / static_cast<double>(q.n)), 2) +
                             std::pow(std::log(static_cast<double>(g->key.k) / static_cast<double>(q.k)), 2);
            if (!best || d < best_d) best = g, best_d = d;
        }
        rate = 2.0 * static_cast<double>(best->key.m) * static_cast<double>(best->key.n) *
               static_cast<double>(best->key.k) / best->seconds;
    }
    return flops / (rate * bm.below * bn.below * bk.below);
}

bool KernelTable::has_attention(DType dt) const {
    return std::any_of(attention.begin(), attention.end(), [&](const Attention& a) { return a.dtype == dt; });
}

double KernelTable::attention_flops_per_second(DType dt, int64_t seq, bool backward) const {
    std::map<int64_t, std::pair<double, int>> by_seq;  // seq -> sum of log rates, rows
    for (const Attention& a : attention) {
        if (a.dtype != dt) continue;
        const double rate = backward ? 2.5 * a.fwd_flops() / (a.fwd_bwd_seconds - a.fwd_seconds)
                                     : a.fwd_flops() / a.fwd_seconds;
        auto& e = by_seq[a.seq];
        e.first += std::log(rate), e.second += 1;
    }
    PTOOL_REQUIRE(!by_seq.empty(), "no attention rows of {} in {}", dtype_name(dt), path);
    std::vector<int64_t> seqs;
    for (const auto& [s, e] : by_seq) seqs.push_back(s);
    const Bracket b = bracket(seqs, static_cast<double>(std::max<int64_t>(1, seq)));
    auto log_rate = [&](size_t i) { return by_seq[seqs[i]].first / by_seq[seqs[i]].second; };
    return std::exp((1 - b.t) * log_rate(b.lo) + b.t * log_rate(b.hi));
}

const KernelTable::MemoryOp* KernelTable::memory_op(const std::string& op, DType dt) const {
    for (const MemoryOp& m : memory)
        if (m.op == op && m.dtype == dt) return &m;
    return nullptr;
}

double KernelTable::stream_bandwidth() const {
    for (const MemoryOp& m : memory)
        if (m.op == "copy") return m.bytes / m.seconds;
    return peak_bandwidth;
}

KernelTable load_kernel_table_text(const std::string& text, const std::string& name) {
    const JsonNode root = load_json_text(text, name, JsonLimits{8 << 20, 8});
    if (!root.is_object()) root.fail("a kernel table is a JSON object (docs/kernel_table.md)");
    only_keys(
        root, "the kernel table",
        {"format", "gpu", "peak", "device", "provenance", "kernel_overhead", "gemm", "attention", "memory"});
    const JsonNode format = root.at("format");
    if (format.as_string("'format'") != kFormat)
        format.fail(fmt::format("'format' must be \"{}\" (this ptool reads that version)", kFormat));
    KernelTable t;
    t.path = name;
    t.gpu = root.at("gpu").as_string("'gpu'");
    load_peak(root.at("peak"), t);
    if (auto d = root.get("device")) {
        only_keys(*d, "'device'", {"name", "sms", "memory_bytes", "context_bytes"});
        if (auto m = d->get("memory_bytes")) t.device_memory = positive(*d, "memory_bytes", "'device'");
        if (auto c = d->get("context_bytes")) t.context_bytes = positive(*d, "context_bytes", "'device'");
        if (t.device_memory > 0 && t.context_bytes >= t.device_memory)
            d->at("context_bytes").fail("'context_bytes' must be below 'memory_bytes'");
    }
    if (auto p = root.get("provenance")) {
        std::vector<std::string> parts;
        for (const auto& [key, value] : p->members("'provenance'"))
            if (value.value().is_string() && !value.value().get<std::string>().empty())
                parts.push_back(fmt::format("{}: {}", key, value.value().get<std::string>()));
        t.provenance = fmt::format("{}", fmt::join(parts, "; "));
    }
    if (auto o = root.get("kernel_overhead")) {
        only_keys(*o, "'kernel_overhead'", {"seconds", "source"});
        const JsonNode v = o->at("seconds");
        t.kernel_overhead = v.as_number("'seconds' of 'kernel_overhead'");
        if (!(t.kernel_overhead >= 0) || t.kernel_overhead > 1)
            v.fail(
                fmt::format("'seconds' of 'kernel_overhead' must be in [0, 1], got {:g}", t.kernel_overhead));
        t.kernel_overhead_source = o->at("source").as_string("'source' of 'kernel_overhead'");
    }
    load_rows(root, t);
    return t;
}

KernelTable load_kernel_table(const std::string& path) {
    return load_kernel_table_text(read_file(path, 8 << 20), path);
}

}  // namespace ptool
