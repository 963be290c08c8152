#include "plan/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/gpu_info.h"
#include "core/device_memory.h"
#include "core/error.h"

namespace ptool {
namespace {

// Random bf16/fp32 values (a fixed LCG, not the model's rng: timing wants varied bits, not draws)
// copied to `device` in blocks of a host buffer: a flat tensor of n elements.
Tensor random_flat(int64_t n, DType dt, Device device) {
    Tensor t({n}, dt, device);
    const int64_t block = std::min<int64_t>(n, int64_t{1} << 24);
    Tensor host({block}, dt, Device::cpu);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < block; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        host.set(i,
                 static_cast<double>(static_cast<int64_t>(s >> 40) - (int64_t{1} << 23)) / double(1 << 23));
    }
    for (int64_t at = 0; at < n; at += block) {
        const int64_t len = std::min(block, n - at);
        Tensor dst = t.narrow(0, at, len);
        copy_bytes(dst.raw(), device, host.raw(), Device::cpu, static_cast<size_t>(len) * dtype_size(dt));
    }
    return t;
}

// A [rows, cols] view of the first rows * cols elements of a flat tensor.
Tensor view2(const Tensor& flat, int64_t rows, int64_t cols) {
    return flat.narrow(0, 0, rows * cols).reshape({rows, cols});
}

// Seconds per call of fn: two warm-up calls, one timed to size the run, then enough calls for
// `target` (3 to 200), each batch timed around a synchronisation of the backend's stream.
double seconds_per_call(Backend& be, const std::function<void()>& fn, double target) {
    using clock = std::chrono::steady_clock;
    fn(), fn();
    be.synchronize();
    auto t0 = clock::now();
    fn();
    be.synchronize();
    const double one = std::max(1e-7, std::chrono::duration<double>(clock::now() - t0).count());
    const int reps = static_cast<int>(std::clamp(target / one, 3.0, 200.0));
    t0 = clock::now();
    for (int i = 0; i < reps; ++i) fn();
    be.synchronize();
    return std::chrono::duration<double>(clock::now() - t0).count() / reps;
}

struct Grid {
    std::vector<int64_t> m, nk;
    std::vector<std::array<int64_t, 3>> float32;  // (m, n, k) measured in float32 too
};

Grid grid_for(const CalibrateOptions& o) {
    if (o.device == Device::cuda && !o.quick)
        return {{256, 1024, 4096, 16384},
                {256, 1024, 2048, 4096, 8192, 14336, 28672},
                {{1024, 1024, 1024},
                 {1024, 4096, 4096},
                 {1024, 8192, 8192},
                 {8192, 1024, 1024},
                 {8192, 4096, 4096},
                 {8192, 8192, 8192}}};
    if (o.device == Device::cuda) return {{256, 4096}, {256, 2048, 8192}, {{1024, 1024, 1024}}};
    return {{32, 128}, {64, 256}, {}};  // the CPU: its float32 GEMMs only
}

void measure_gemms(Backend& be, const CalibrateOptions& o, KernelTable& t) {
    const Grid g = grid_for(o);
    const int64_t mm = g.m.back(), nk = g.nk.back();
    std::vector<DType> dtypes;
    if (o.device == Device::cuda) dtypes.push_back(DType::bfloat16);
    if (o.device != Device::cuda || !g.float32.empty()) dtypes.push_back(DType::float32);
    for (DType dt : dtypes) {
        std::vector<std::array<int64_t, 3>> shapes;
        if (dt == DType::bfloat16 || o.device != Device::cuda) {
            for (int64_t m : g.m)
                for (int64_t n : g.nk)
                    for (int64_t k : g.nk) shapes.push_back({m, n, k});
        } else {
            shapes = g.float32;
        }
        int64_t most_m = 0, most_nk = 0;
        for (const auto& s : shapes)
            most_m = std::max(most_m, s[0]), most_nk = std::max({most_nk, s[1], s[2]});
        const Tensor xs = random_flat(most_m * most_nk, dt, o.device),
                     ws = random_flat(most_nk * most_nk, dt, o.device),
                     dys = random_flat(most_m * most_nk, dt, o.device);
        Tensor out = Tensor::empty({std::max(most_m, most_nk) * most_nk}, dt, o.device);
        (void)mm, (void)nk;
        for (const auto& [m, n, k] : shapes) {
            const Tensor x = view2(xs, m, k), w = view2(ws, n, k), dy = view2(dys, m, n);
            Tensor y = view2(out, m, n), dx = view2(out, m, k), dw = view2(out, n, k);
            const double target = o.target_seconds;
            t.gemm.push_back({{GemmOp::fwd, dt, m, n, k},
                              seconds_per_call(
                                  be, [&] { be.gemm(x, false, w, true, y); }, target)});
            t.gemm.push_back({{GemmOp::dgrad, dt, m, n, k},
                              seconds_per_call(
                                  be, [&] { be.gemm(dy, false, w, false, dx); }, target)});
            t.gemm.push_back({{GemmOp::wgrad, dt, m, n, k},
                              seconds_per_call(
                                  be, [&] { be.gemm(dy, true, x, false, dw); }, target)});
        }
        if (o.progress) o.progress(fmt::format("{} {} GEMMs", shapes.size() * 3, dtype_name(dt)));
    }
}

// ptool's attention of one head at a time (as its backends run a flash head): scores = q k^T,
// softmax (causal), o = p v; backward dp = do v^T, dv = p^T do, ds = softmax'(p, dp), dq = ds k,
// dk = ds^T q. Timed per head, counted for the row's batch x heads.
void measure_attention(Backend& be, const CalibrateOptions& o, KernelTable& t) {
    const bool gpu = o.device == Device::cuda;
    const DType dt = gpu ? DType::bfloat16 : DType::float32;
    const int64_t d = gpu ? 128 : 32, heads = gpu ? 32 : 4, tokens = gpu ? 8192 : 256;
    const std::vector<int64_t> seqs =
        gpu ? (o.quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 2048, 4096, 8192})
            : std::vector<int64_t>{64, 128};
    for (int64_t s : seqs) {
        const Tensor q = random_flat(s * d, dt, o.device).reshape({1, s, d}),
                     k = random_flat(s * d, dt, o.device).reshape({1, s, d}),
                     v = random_flat(s * d, dt, o.device).reshape({1, s, d}),
                     dout = random_flat(s * d, dt, o.device).reshape({1, s, d});
        Tensor sc({1, s, s}, dt, o.device), p({1, s, s}, dt, o.device), dp({1, s, s}, dt, o.device),
            ds({1, s, s}, dt, o.device), out({1, s, d}, dt, o.device), dq({1, s, d}, dt, o.device),
            dk({1, s, d}, dt, o.device), dv({1, s, d}, dt, o.device);
        auto forward = [&] {
            be.gemm(q, false, k, true, sc, 1.0 / std::sqrt(static_cast<double>(d)));
            be.softmax(sc, true, p);
            be.gemm(p, false, v, false, out);
        };
        auto backward = [&] {
            be.gemm(dout, false, v, true, dp);
            be.gemm(p, true, dout, false, dv);
            be.softmax_backward(p, dp, ds);
            be.gemm(ds, false, k, false, dq);
            be.gemm(ds, true, q, false, dk);
        };
        const double f = seconds_per_call(be, forward, o.target_seconds);
        const double fb = seconds_per_call(
            be, [&] { forward(), backward(); }, o.target_seconds);
        const int64_t batch = std::max<int64_t>(1, tokens / s);
        const double per = static_cast<double>(batch * heads);
        t.attention.push_back({dt, true, batch, heads, heads, s, d, f * per, std::max(fb, f * 1.01) * per});
    }
    if (o.progress) o.progress(fmt::format("{} attention rows (ptool's kernels, per head)", seqs.size()));
}

void measure_memory(Backend& be, const CalibrateOptions& o, KernelTable& t) {
    const bool gpu = o.device == Device::cuda;
    const DType dt = gpu ? DType::bfloat16 : DType::float32;
    const int64_t n = gpu ? (o.quick ? int64_t{1} << 26 : int64_t{1} << 28) : int64_t{1} << 22;
    const double es = static_cast<double>(dtype_size(dt));
    {
        const Tensor a = random_flat(n, dt, o.device), b = random_flat(n, dt, o.device);
        Tensor c({n}, dt, o.device);
        const double copy = seconds_per_call(
            be, [&] { be.copy(a, c); }, o.target_seconds);
        t.memory.push_back({"copy", dt, static_cast<double>(n), 2 * es * static_cast<double>(n), copy});
        const double add = seconds_per_call(
            be, [&] { be.add(a, b, c); }, o.target_seconds);
        t.memory.push_back({"add", dt, static_cast<double>(n), 3 * es * static_cast<double>(n), add});
    }
    // the loss as ptool runs it: the logits upcast, cross entropy with its gradient, the cast back
    const int64_t rows = gpu ? 4096 : 256, vocab = gpu ? 32768 : 4096;
    const Tensor logits = random_flat(rows * vocab, dt, o.device).reshape({rows, vocab});
    Tensor target({rows}, DType::int64, o.device);
    Tensor grad32({rows, vocab}, DType::float32, o.device), grad({rows, vocab}, dt, o.device);
    const double ce = seconds_per_call(
        be,
        [&] {
            const Tensor up = to_dtype(be, logits, DType::float32);
            be.cross_entropy(up, target, -100, static_cast<double>(rows), grad32);
            be.copy(grad32, grad);
        },
        o.target_seconds);
    const double elements = static_cast<double>(rows * vocab);
    t.memory.push_back({"cross_entropy", dt, elements, es * elements, ce});
    if (o.progress) o.progress("memory-bound: copy, add, the upcast loss");
}

}  // namespace

std::optional<std::pair<std::map<DType, double>, double>> known_gpu_peaks(const std::string& name) {
    struct Known {
        const char* contains;
        double bf16, fp32, bandwidth_gb_s;
    };
    // vendor datasheets, dense (no sparsity); fp32 without TF32 (torch's default)
    static const Known known[] = {{"H200", 989, 67, 4800},
                                  {"H100 80GB HBM3", 989, 67, 3350},  // SXM5
                                  {"H100 PCIe", 756, 51, 2000},
                                  {"H100 NVL", 835, 60, 3900},
                                  {"A100-SXM4-80GB", 312, 19.5, 2039},
                                  {"A100-SXM4-40GB", 312, 19.5, 1555},
                                  {"A100 80GB PCIe", 312, 19.5, 1935}};
    for (const Known& k : known)
        if (name.find(k.contains) != std::string::npos)
            return std::make_pair(std::map<DType, double>{{DType::bfloat16, k.bf16 * 1e12},
                                                          {DType::float16, k.bf16 * 1e12},
                                                          {DType::float32, k.fp32 * 1e12}},
                                  k.bandwidth_gb_s * 1e9);
    return std::nullopt;
}

KernelTable calibrate(const CalibrateOptions& o) {
    KernelTable t;
    std::string device_name = "this machine's CPU";
    if (o.device == Device::cuda) {
        const GpuInfo info = query_gpus();
        if (info.devices.empty())
            throw RuntimeError(fmt::format("ptool calibrate --device cuda: no GPU ({})", info.why_none));
        device_name = info.devices[0].name;
        t.device_memory = static_cast<double>(info.devices[0].memory_bytes);
    } else if (o.device != Device::cpu) {
        throw InputError("ptool calibrate measures --device cuda or cpu");
    }
    Backend& be = backend_for(o.device);
    if (o.device == Device::cuda)
        t.context_bytes = static_cast<double>(gpu_used_bytes());  // the context, before any tensor
    t.gpu = device_name;
    measure_gemms(be, o, t);
    measure_attention(be, o, t);
    measure_memory(be, o, t);
    t.peak_flops = o.peak_flops;
    t.peak_bandwidth = o.peak_bandwidth;
    std::string source = o.peak_source;
    if (t.peak_flops.empty())
        if (auto known = known_gpu_peaks(device_name))
            t.peak_flops = known->first, t.peak_bandwidth = known->second,
            source = "the vendor's, by the device's name";
    if (t.peak_flops.empty()) {  // unknown: the best measured rates stand for the peaks
        for (const auto& g : t.gemm) {
            const double rate = 2.0 * static_cast<double>(g.key.m) * static_cast<double>(g.key.n) *
                                static_cast<double>(g.key.k) / g.seconds;
            t.peak_flops[g.key.dtype] = std::max(t.peak_flops[g.key.dtype], rate);
        }
        t.peak_bandwidth = t.stream_bandwidth();
        source = "the best measured rates (no vendor peaks known for this device; pass --cluster)";
    }
    if (t.peak_bandwidth <= 0) t.peak_bandwidth = t.stream_bandwidth();
    t.provenance = fmt::format("measured: by ptool calibrate --device {} with ptool's {} backend; peaks: {}",
                               o.device == Device::cuda ? "cuda" : "cpu", be.name(), source);
    return t;
}

std::string kernel_table_json(const KernelTable& t) {
    using nlohmann::ordered_json;
    auto line = [](const ordered_json& j) { return j.dump(); };
    ordered_json peak = {{"tflops", ordered_json::object()},
                         {"memory_bandwidth_gb_s", t.peak_bandwidth / 1e9}};
    for (const auto& [dt, f] : t.peak_flops) peak["tflops"][dtype_name(dt)] = f / 1e12;
    ordered_json device = {{"name", t.gpu}};
    if (t.device_memory > 0) device["memory_bytes"] = static_cast<int64_t>(t.device_memory);
    if (t.context_bytes > 0) device["context_bytes"] = static_cast<int64_t>(t.context_bytes);
    std::string out = "{\n  \"format\": \"ptool kernel table 1\",\n";
    out += "  \"gpu\": " + ordered_json(t.gpu).dump() + ",\n";
    out += "  \"peak\": " + line(peak) + ",\n";
    out += "  \"device\": " + line(device) + ",\n";
    out += "  \"provenance\": " + line({{"by", t.provenance}}) + ",\n";
    auto rows = [&](const char* key, const std::vector<ordered_json>& items, bool last) {
        out += fmt::format("  \"{}\": [\n", key);
        for (size_t i = 0; i < items.size(); ++i)
            out += "    " + line(items[i]) + (i + 1 < items.size() ? ",\n" : "\n");
        out += last ? "  ]\n" : "  ],\n";
    };
    std::vector<ordered_json> g, a, m;
    for (const auto& r : t.gemm)
        g.push_back({{"dtype", dtype_name(r.key.dtype)},
                     {"op", gemm_op_name(r.key.op)},
                     {"m", r.key.m},
                     {"n", r.key.n},
                     {"k", r.key.k},
                     {"seconds", r.seconds}});
    for (const auto& r : t.attention)
        a.push_back({{"dtype", dtype_name(r.dtype)},
                     {"causal", r.causal},
                     {"batch", r.batch},
                     {"heads", r.heads},
                     {"kv_heads", r.kv_heads},
                     {"seq", r.seq},
                     {"head_dim", r.head_dim},
                     {"fwd_seconds", r.fwd_seconds},
                     {"fwd_bwd_seconds", r.fwd_bwd_seconds}});
    for (const auto& r : t.memory)
        m.push_back({{"op", r.op},
                     {"dtype", dtype_name(r.dtype)},
                     {"elements", r.elements},
                     {"bytes", r.bytes},
                     {"seconds", r.seconds}});
    rows("gemm", g, false);
    rows("attention", a, false);
    rows("memory", m, true);
    return out + "}\n";
}

}  // namespace ptool
