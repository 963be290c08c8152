#include "plan/cluster.h"

#include <filesystem>

#include "core/yaml_reader.h"
#include "plan/kernel_table.h"

namespace ptool {
namespace {

// A rate, size or time in [max / 1e12, max]: finite, far beyond any machine's and far from 0, so that
// the time model's products and quotients and the printed bytes and times stay finite numbers (1e300
// GiB printed as a negative byte count, a latency of 1e308 us as 300-digit times, a bandwidth of
// 1e-320 GB/s priced every step at infinity).
double positive(YamlMap& m, const std::string& key, const std::string& what, double max) {
    YamlNode n = m.at(key);
    const double v = n.as_double(fmt::format("'{}' of {}", key, what)), min = max * 1e-12;
    if (!(v >= min) || v > max)
        n.fail(fmt::format("'{}' of {} must be in [{:g}, {:g}], got {:g}", key, what, min, max, v));
    return v;
}

constexpr double kMaxGib = 1 << 20;      // memory per GPU: 1 PiB
constexpr double kMaxTflops = 1e6;       // per GPU
constexpr double kMaxGbPerSecond = 1e6;  // 1 PB/s
constexpr double kMaxLatencyUs = 1e6;    // 1 s per hop

Link load_link(const YamlNode& node, const std::string& what) {
    YamlMap m(node, what);
    Link l;
    l.bandwidth = positive(m, "bandwidth_gb_s", what, kMaxGbPerSecond) * 1e9;
    l.latency = positive(m, "latency_us", what, kMaxLatencyUs) * 1e-6;
    m.finish();
    return l;
}

constexpr double kMib = 1 << 20;

RuntimeMemory load_runtime(const YamlNode& node) {
    YamlMap m(node, "'runtime'");
    RuntimeMemory r;
    auto mib = [&](const char* key) {
        if (!m.has(key)) return 0.0;
        const double v = m.at(key).as_double(fmt::format("'{}' of 'runtime'", key));
        if (!(v >= 0) || v > kMaxGib * 1024)
            m.at(key).fail(
                fmt::format("'{}' of 'runtime' must be in [0, {:g}] MiB, got {:g}", key, kMaxGib * 1024, v));
        return v * kMib;
    };
    r.cuda_context = mib("cuda_context_mib");
    r.step_runtime = mib("step_runtime_mib");
    r.cublas_workspace = mib("cublas_workspace_mib");
    r.nccl_per_communicator = mib("nccl_mib_per_communicator");
    m.finish();
    return r;
}

}  // namespace

double Cluster::peak_flops(DType dt) const {
    auto it = flops.find(dt);
    return it == flops.end() ? 0 : it->second;
}

std::string Cluster::no_float8() const {
    if (has_float8()) return "";
    return fmt::format(
        "the cluster '{}' ({}) has no float8 tensor cores: its 'tflops' has no float8 entry "
        "(torch._scaled_mm "
        "needs sm_89 or later: H100, H200, L40S; an A100 is sm_80)",
        name, path);
}

Cluster load_cluster_text(const std::string& text, const std::string& name) {
    YamlMap m(load_yaml_text(text, name), "the cluster");
    Cluster c;
    c.path = name;
    c.name = m.string_or("name", name);
    // each read whole and bounded before it is an int (2^31 nodes wrapped to 0 GPUs, 2^32 + 1 to one)
    constexpr int64_t kMaxGpus = int64_t{1} << 20;
    const int64_t nodes = m.at("nodes").as_positive_int("'nodes'"),
                  per_node = m.at("gpus_per_node").as_positive_int("'gpus_per_node'");
    if (per_node > kMaxGpus) m.at("gpus_per_node").fail("more than 2^20 GPUs");
    if (nodes > kMaxGpus / per_node) m.at("nodes").fail("more than 2^20 GPUs");
    c.nodes = static_cast<int>(nodes), c.gpus_per_node = static_cast<int>(per_node);
    c.memory_bytes = positive(m, "memory_gib", "the cluster", kMaxGib) * (1ull << 30);
    c.reserved_bytes = m.double_or("reserved_gib", 0) * (1ull << 30);
    if (!(c.reserved_bytes >= 0) || c.reserved_bytes >= c.memory_bytes)
        m.at("reserved_gib").fail("'reserved_gib' must be >= 0 and below 'memory_gib'");
    if (m.has("runtime")) {
        c.runtime = load_runtime(m.at("runtime"));
        if (c.runtime.cuda_context + c.runtime.cublas_workspace + c.runtime.step_runtime + c.reserved_bytes >=
            c.memory_bytes)
            m.at("runtime").fail(
                "the runtime's CUDA context, cuBLAS workspace and step runtime (and 'reserved_gib') leave no "
                "memory for tensors: they must be below 'memory_gib'");
    }
    YamlNode f = m.at("tflops");
    YamlMap fm(f, "'tflops'");
    for (const auto& kv : f.raw()) {
        const std::string key = kv.first.Scalar();
        if (key == "float8") {  // torch._scaled_mm's float8 tensor cores: the capability (sm_89+)
            c.float8_flops = positive(fm, key, "'tflops'", kMaxTflops) * 1e12;
            continue;
        }
        DType dt;
        try {
            dt = parse_dtype(key);
        } catch (const std::exception&) {
            YamlNode(kv.first, std::make_shared<std::string>(name))
                .fail(
                    fmt::format("'{}' is not a dtype (float32, bfloat16, float16, float64) nor float8", key));
        }
        c.flops[dt] = positive(fm, key, "'tflops'", kMaxTflops) * 1e12;
    }
    fm.finish();
    c.gemm_efficiency = m.double_or("gemm_efficiency", 1.0);
    if (!(c.gemm_efficiency >= 1e-6 && c.gemm_efficiency <= 1))  // (a GEMM's time is divided by it)
        m.at("gemm_efficiency").fail("'gemm_efficiency' must be in [1e-6, 1]");
    c.memory_bandwidth = positive(m, "memory_bandwidth_gb_s", "the cluster", kMaxGbPerSecond) * 1e9;
    if (m.has("kernels")) {  // relative to the cluster file
        YamlNode k = m.at("kernels");
        const std::string rel = k.as_string("'kernels'");
        const std::filesystem::path file = std::filesystem::path(rel).is_absolute()
                                               ? std::filesystem::path(rel)
                                               : std::filesystem::path(name).parent_path() / rel;
        std::error_code ec;
        if (!std::filesystem::is_regular_file(file, ec))
            k.fail(fmt::format("'kernels': no kernel table at '{}' (a path relative to the cluster file)",
                               file.string()));
        c.kernels = std::make_shared<const KernelTable>(load_kernel_table(file.string()));
        c.kernels_path = file.string();
    }
    c.intra = load_link(m.at("intra_node"), "'intra_node'");
    c.inter = c.nodes > 1 || m.has("inter_node") ? load_link(m.at("inter_node"), "'inter_node'") : c.intra;
    m.finish();
    return c;
}

Cluster load_cluster(const std::string& path) {
    return load_cluster_text(read_file(path, YamlLimits{}.max_bytes), path);
}

}  // namespace ptool
