#include "cli/explain_terms.h"

#include <spdlog/spdlog.h>

#include <set>

#include "cli/explain_output.h"
#include "cli/verify_output.h"
#include "plan/kernel_table.h"

namespace ptool::cli {
namespace {

std::string ms(double seconds) {
    return fmt::format("{:.1f} ms", seconds * 1e3);
}

const char* kStreams[] = {"compute", "all-gather", "reduce-scatter", "all-reduce"};

}  // namespace

void print_memory(const ExplainReport& r) {
    const bool on_gpu = r.cluster.has_value();
    fmt::print(
        "\n  memory per rank (predicted for PyTorch's run of the plan: every tensor of its step as PyTorch "
        "allocates it,\n  replayed through its caching allocator; {} steps simulated, the steady state from "
        "the "
        "third on):\n",
        r.simulated_steps);
    std::vector<std::vector<std::string>> rows = {{"ranks", "allocated", "reserved"}};
    if (on_gpu) rows[0].push_back("on the GPU");
    rows[0].insert(rows[0].end(), {"first step", "ptool's run", "at the allocated peak"});
    for (size_t i = 0; i < r.memory.size(); ++i) {
        const RankMemory& m = r.memory[i].sim.memory;
        std::vector<std::string> uses;
        for (int u = 0; u < kMemoryUses; ++u)
            if (m.torch_at_peak[u] > 0)
                uses.push_back(fmt::format("{} {}", memory_use_name(static_cast<MemoryUse>(u)),
                                           format_bytes(m.torch_at_peak[u])));
        std::vector<std::string> row = {rank_ranges(r.memory[i].ranks), format_bytes(m.torch_peak),
                                        format_bytes(m.reserved_peak)};
        if (on_gpu)
            row.push_back(
                format_bytes(m.reserved_peak + static_cast<int64_t>(r.overheads[i].outside_allocator())));
        row.insert(row.end(), {format_bytes(m.torch_first_step_peak), format_bytes(m.peak),
                               fmt::format("{}", fmt::join(uses, ", "))});
        rows.push_back(std::move(row));
    }
    print_columns(rows, "    ");
    fmt::print(
        "  (allocated: torch.cuda.max_memory_allocated; reserved: torch.cuda.max_memory_reserved, the "
        "allocator's segments,\n   each stream's kept apart{}; first step: allocated before AdamW's state "
        "exists; ptool's run: what ptool's own\n   step holds, what verify measures)\n",
        on_gpu ? "; on the GPU: reserved plus the runtime outside the allocator" : "");
    for (size_t i = 0; i < r.memory.size(); ++i) {
        const RankMemory& m = r.memory[i].sim.memory;
        std::vector<std::string> pools;
        for (size_t s = 0; s < m.reserved_by_stream.size(); ++s)
            if (m.reserved_by_stream[s] > 0)
                pools.push_back(fmt::format("{} {}", kStreams[s], format_bytes(m.reserved_by_stream[s])));
        fmt::print("  reserved of ranks {} by stream at its peak: {}{}\n", rank_ranges(r.memory[i].ranks),
                   fmt::join(pools, ", "),
                   on_gpu ? fmt::format(", cuBLAS's workspaces {}",
                                        format_bytes(static_cast<int64_t>(r.overheads[i].cublas_workspaces)))
                          : std::string());
    }
    if (on_gpu) {
        const Cluster& cl = *r.cluster;
        std::set<int> communicators;
        for (const DeviceOverheads& o : r.overheads) communicators.insert(o.communicators);
        fmt::print(
            "  runtime per GPU ({}'s `runtime`): CUDA context {}, after a step {}, cuBLAS workspaces 2 x {} "
            "(in "
            "the allocator),\n  NCCL {} per communicator x {} communicators (an upper bound); GPU memory {}, "
            "reserve {}\n",
            cl.name, format_bytes(static_cast<int64_t>(cl.runtime.cuda_context)),
            format_bytes(static_cast<int64_t>(cl.runtime.step_runtime)),
            format_bytes(static_cast<int64_t>(cl.runtime.cublas_workspace)),
            format_bytes(static_cast<int64_t>(cl.runtime.nccl_per_communicator)),
            fmt::join(communicators, " or "), format_bytes(static_cast<int64_t>(cl.memory_bytes)),
            format_bytes(static_cast<int64_t>(cl.reserved_bytes)));
    }
    for (const MemoryAssumption& a : r.assumptions)
        fmt::print("  assumed, erring high by up to {}: {}\n", format_bytes(static_cast<int64_t>(a.bytes)),
                   a.what);
}

void print_compute_terms(const ExplainReport& r) {
    if (r.times.empty()) return;
    fmt::print("  compute, term by term ({}):\n", r.kernel_source);
    const KernelTable* k = r.cluster->kernels.get();
    for (size_t i = 0; i < r.times.size(); ++i) {
        const ComputeTerms& t = r.times[i].terms;
        std::vector<std::vector<std::string>> rows = {
            {"ranks " + rank_ranges(r.memory[i].ranks), "seconds", "what"}};
        rows.push_back(
            {"GEMMs", ms(t.gemm[0] + t.gemm[1] + t.gemm[2]),
             fmt::format("fwd {}, dgrad {}, wgrad {}; {} shapes{}", ms(t.gemm[0]), ms(t.gemm[1]),
                         ms(t.gemm[2]), t.gemms.size(), k ? ", the table's by shape" : ", roofline")});
        if (t.attention[0] + t.attention[1] > 0) {
            std::set<int64_t> dims;
            for (const auto& a : t.attentions) dims.insert(a.attention.head_dim);
            std::set<int64_t> measured;
            if (k)
                for (const auto& row : k->attention) measured.insert(row.head_dim);
            bool assumed = false;
            for (int64_t d : dims) assumed = assumed || !measured.count(d);
            rows.push_back(
                {"attention", ms(t.attention[0] + t.attention[1]),
                 fmt::format("fused; fwd {}, bwd {}{}", ms(t.attention[0]), ms(t.attention[1]),
                             assumed ? fmt::format("; head_dim {} at the measured head_dim's rate (assumed)",
                                                   fmt::join(dims, ", "))
                                     : std::string())});
        }
        rows.push_back(
            {"memory-bound", ms(t.memory),
             fmt::format("{:.1f} GB read and written at the streaming bandwidth", t.memory_bytes / 1e9)});
        for (int o = 0; o < kOpClasses; ++o)
            if (t.ops[o] > 0)
                rows.push_back({op_class_name(static_cast<OpClass>(o)), ms(t.ops[o]),
                                t.op_measured[o] ? "measured whole" : "its kernels' bytes (derived)"});
        if (t.launch > 0)
            rows.push_back(
                {"kernel overhead", ms(t.launch),
                 fmt::format("{:.0f} memory-bound kernels x {:.2f} us ({})", t.launch / k->kernel_overhead,
                             k->kernel_overhead * 1e6, k->kernel_overhead_source)});
        print_columns(rows, "    ");
    }
}

void add_memory_terms(nlohmann::json& e, const ExplainReport& r, size_t i) {
    const RankMemory& m = r.memory[i].sim.memory;
    e["allocated_peak_bytes"] = m.torch_peak;
    e["first_step_allocated_peak_bytes"] = m.torch_first_step_peak;
    nlohmann::json uses = nlohmann::json::object();
    for (int u = 0; u < kMemoryUses; ++u)
        if (m.torch_at_peak[u] != 0) uses[memory_use_name(static_cast<MemoryUse>(u))] = m.torch_at_peak[u];
    e["allocated_at_peak"] = uses;
    nlohmann::json pools = nlohmann::json::object();
    for (size_t s = 0; s < m.reserved_by_stream.size(); ++s)
        if (m.reserved_by_stream[s] > 0) pools[kStreams[s]] = m.reserved_by_stream[s];
    e["reserved_by_stream_bytes"] = pools;
    nlohmann::json assumed = nlohmann::json::array();
    for (const MemoryAssumption& a : r.assumptions)
        assumed.push_back({{"what", a.what}, {"up_to_bytes", a.bytes}});
    e["assumed_high"] = assumed;
}

nlohmann::json compute_terms_json(const ComputeTerms& t) {
    nlohmann::json ops = nlohmann::json::object();
    for (int o = 0; o < kOpClasses; ++o)
        if (t.ops[o] > 0)
            ops[op_class_name(static_cast<OpClass>(o))] = {{"seconds", t.ops[o]},
                                                           {"measured", t.op_measured[o]}};
    nlohmann::json gemms = nlohmann::json::array();
    for (const ComputeTerms::Shape& s : t.gemms)
        gemms.push_back({{"op", gemm_op_name(s.gemm.op)},
                         {"dtype", dtype_name(s.gemm.dtype)},
                         {"float8", s.gemm.float8},
                         {"m", s.gemm.m},
                         {"n", s.gemm.n},
                         {"k", s.gemm.k},
                         {"calls", s.count},
                         {"seconds", s.seconds}});
    nlohmann::json attention = nlohmann::json::array();
    for (const ComputeTerms::Shape& s : t.attentions)
        attention.push_back({{"phase", s.attention.backward ? "bwd" : "fwd"},
                             {"dtype", dtype_name(s.attention.dtype)},
                             {"seq_q", s.attention.seq_q},
                             {"seq_k", s.attention.seq_k},
                             {"head_dim", s.attention.head_dim},
                             {"causal", s.attention.causal},
                             {"flops", s.count},
                             {"seconds", s.seconds}});
    return {{"gemm_fwd_seconds", t.gemm[0]},
            {"gemm_dgrad_seconds", t.gemm[1]},
            {"gemm_wgrad_seconds", t.gemm[2]},
            {"attention_fwd_seconds", t.attention[0]},
            {"attention_bwd_seconds", t.attention[1]},
            {"memory_bound_seconds", t.memory},
            {"memory_bound_bytes", t.memory_bytes},
            {"kernel_overhead_seconds", t.launch},
            {"kernels", t.kernels},
            {"framework_ops", ops},
            {"gemms", gemms},
            {"attention", attention}};
}

}  // namespace ptool::cli
