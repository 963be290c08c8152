#include "plan/kernel_model.h"

#include <algorithm>
#include <map>
#include <memory>

#include "core/error.h"
#include "plan/kernel_table.h"

namespace ptool {
namespace {

// The dtype whose table rows price `dt`: its own, else bfloat16's, else the first measured (scaled
// by the peaks).
DType table_dtype(const KernelTable& k, DType dt, bool attention) {
    if (!attention) return k.gemm_dtype_for(dt);
    if (k.has_attention(dt) || k.attention.empty()) return dt;
    return k.has_attention(DType::bfloat16) ? DType::bfloat16 : k.attention.front().dtype;
}

double peak_of(const std::map<DType, double>& peaks, DType dt) {
    auto it = peaks.find(dt);
    return it == peaks.end() ? 0 : it->second;
}

// KernelTable::gemm_seconds of the cluster's table, remembered per key on the calling thread: a
// plan search prices the same shapes in every simulated action (perf: 4% of `ptool plan`'s time
// went to interpolating them again). The table is immutable (Cluster::kernels holds it const) and
// the cache starts over whenever it is asked about another table (or a new one at the same
// address: the weak_ptr of the old one has expired), so it returns gemm_seconds' own result.
double gemm_seconds_of(const std::shared_ptr<const KernelTable>& table, const GemmKey& q) {
    thread_local std::weak_ptr<const KernelTable> cached_table;
    thread_local std::map<GemmKey, double> seconds;
    if (cached_table.lock() != table) cached_table = table, seconds.clear();
    if (auto it = seconds.find(q); it != seconds.end()) return it->second;
    const double s = table->gemm_seconds(q);
    seconds.emplace(q, s);
    return s;
}

void require_rate(const Cluster& c, DType dt) {
    if (c.peak_flops(dt) <= 0)
        throw InputError(
            SourceLocation{c.path, 1, 1},
            fmt::format("the cluster names no 'tflops' for {}, the plan's compute dtype", dtype_name(dt)));
}

// A float8 GEMM on a GPU without float8 tensor cores (explain refuses the plan's section before
// this; a caller that priced float8 work on such a cluster anyway gets the cluster's reason).
void require_float8(const Cluster& c, const MetaWork& w) {
    if (c.has_float8()) return;
    for (const auto& [key, calls] : w.gemms)
        if (key.float8) throw InputError(SourceLocation{c.path, 1, 1}, c.no_float8());
}

}  // namespace

double ComputeTerms::total() const {
    double s = memory + launch;
    for (double x : gemm) s += x;
    for (double x : attention) s += x;
    for (double x : ops) s += x;
    return s;
}

ComputeTerms compute_terms(const MetaWork& w, const Cluster& c, DType compute) {
    require_rate(c, compute);
    require_float8(c, w);
    ComputeTerms t;
    t.memory_bytes = w.memory_bytes, t.kernels = w.kernels;
    const KernelTable* k = c.kernels.get();
    if (!k) {  // the roofline: FLOPs at gemm_efficiency of peak, bytes at the memory bandwidth
        auto rate = [&](DType dt, bool float8 = false) {
            const double p = float8                 ? c.float8_flops
                             : c.peak_flops(dt) > 0 ? c.peak_flops(dt)
                                                    : c.peak_flops(compute);
            return p * c.gemm_efficiency;
        };
        for (const auto& [key, calls] : w.gemms)  // a float8 GEMM at the float8 peak
            t.gemm[static_cast<int>(key.op)] += calls * 2.0 * static_cast<double>(key.m) *
                                                static_cast<double>(key.n) * static_cast<double>(key.k) /
                                                rate(key.dtype, key.float8);
        for (const auto& [key, flops] : w.attention) t.attention[key.backward] += flops / rate(key.dtype);
        t.memory = w.memory_bytes / c.memory_bandwidth;
        for (const auto& [key, n] : w.ops)
            t.ops[static_cast<int>(key.op)] +=
                n.elements * framework_bytes(key.op, key.dtype) / c.memory_bandwidth;
        return t;
    }
    auto compute_scale = [&](DType rows, DType dt) {  // the table's seconds of `rows` -> this GPU's of dt
        const double mine = c.peak_flops(dt) > 0 ? c.peak_flops(dt) : c.peak_flops(compute);
        return peak_of(k->peak_flops, rows) / mine;
    };
    const double stream = k->stream_bandwidth() * c.memory_bandwidth / k->peak_bandwidth;
    for (const auto& [key, calls] : w.gemms) {
        GemmKey q = key;
        q.dtype = table_dtype(*k, key.dtype, false);
        // the table's float8 rows scale by the float8 peaks, as its other rows by their dtype's; a
        // table without float8 rows prices them as the output dtype's (kernel_table.h)
        const double scale = key.float8 && k->has_float8_gemm(q.dtype) ? k->float8_peak_flops / c.float8_flops
                                                                       : compute_scale(q.dtype, key.dtype);
        const double s = calls * gemm_seconds_of(c.kernels, q) * scale;
        t.gemm[static_cast<int>(key.op)] += s;
        t.gemms.push_back({key, {}, calls, s});
    }
    for (const auto& [key, flops] : w.attention) {
        const DType rows = table_dtype(*k, key.dtype, true);
        const double rate = k->has_attention(rows)
                                ? k->attention_flops_per_second(rows, key.seq_k, key.backward) /
                                      compute_scale(rows, key.dtype)
                                : c.peak_flops(key.dtype) * c.gemm_efficiency;
        t.attention[key.backward] += flops / rate;
        t.attentions.push_back({{}, key, flops, flops / rate});
    }
    auto slowest = [](const ComputeTerms::Shape& a, const ComputeTerms::Shape& b) {
        return a.seconds > b.seconds;
    };
    std::sort(t.gemms.begin(), t.gemms.end(), slowest);
    std::sort(t.attentions.begin(), t.attentions.end(), slowest);
    t.memory = w.memory_bytes / stream;
    double kernels = w.kernels;  // those whose fixed cost no measurement includes
    for (const auto& [key, n] : w.ops) {
        const int i = static_cast<int>(key.op);
        if (const KernelTable::MemoryOp* m = k->memory_op(op_class_name(key.op), key.dtype)) {
            t.ops[i] += n.elements * m->seconds / m->elements * k->peak_bandwidth / c.memory_bandwidth;
            t.op_measured[i] = true;
        } else {
            t.ops[i] += n.elements * framework_bytes(key.op, key.dtype) / stream;
            kernels += n.kernels;
        }
    }
    t.launch = kernels * k->kernel_overhead;
    return t;
}

std::string kernel_model_source(const Cluster& c) {
    const KernelTable* k = c.kernels.get();
    if (!k)
        return fmt::format(
            "assumed: no kernel table, GEMMs and attention at gemm_efficiency {:g} of peak, other "
            "ops' bytes at {:.0f} GB/s",
            c.gemm_efficiency, c.memory_bandwidth / 1e9);
    std::vector<std::string> scales;
    for (const auto& [dt, peak] : k->peak_flops)
        if (c.peak_flops(dt) > 0 && std::abs(c.peak_flops(dt) / peak - 1) > 1e-9)
            scales.push_back(fmt::format("{} x{:.3f}", dtype_name(dt), c.peak_flops(dt) / peak));
    if (k->float8_peak_flops > 0 && c.has_float8() &&
        std::abs(c.float8_flops / k->float8_peak_flops - 1) > 1e-9)
        scales.push_back(fmt::format("float8 x{:.3f}", c.float8_flops / k->float8_peak_flops));
    if (std::abs(c.memory_bandwidth / k->peak_bandwidth - 1) > 1e-9)
        scales.push_back(fmt::format("memory x{:.3f}", c.memory_bandwidth / k->peak_bandwidth));
    if (scales.empty()) return fmt::format("measured: {} ({})", k->path, k->gpu);
    return fmt::format("derived: {} (measured on {}) scaled by this GPU's peaks: {}", k->path, k->gpu,
                       fmt::join(scales, ", "));
}

}  // namespace ptool
