// `ptool explain`'s terminal text: the plan's summary, its modules and parameters, each parallel
// dim's part, the collectives per step, the memory per rank class and, with a cluster, the step time.
#include <spdlog/spdlog.h>

#include <map>
#include <set>

#include "cli/explain_output.h"
#include "cli/explain_terms.h"
#include "cli/verify_output.h"

namespace ptool::cli {
namespace {

std::string local_shapes(const ParamLayout& p) {  // "[3, 16] x3, [1, 16]"
    std::vector<std::pair<Shape, int>> runs;
    for (const Shape& s : p.local) {
        if (!runs.empty() && runs.back().first == s)
            ++runs.back().second;
        else
            runs.push_back({s, 1});
    }
    std::vector<std::string> parts;
    for (const auto& [s, k] : runs)
        parts.push_back(k > 1 ? fmt::format("{} x{}", shape_str(s), k) : shape_str(s));
    return fmt::format("{}", fmt::join(parts, ", "));
}

// Per rank class, whether its memory fits the GPU (plan/device_overheads.h: the runtime outside the
// caching allocator besides what it reserves).
void warn_fit(const ExplainReport& r) {
    const Cluster& cl = *r.cluster;
    for (size_t i = 0; i < r.memory.size(); ++i) {
        const RankMemory& m = r.memory[i].sim.memory;
        const double needs =
            static_cast<double>(m.torch_peak) + r.overheads[i].outside_allocator() + cl.reserved_bytes;
        if (needs > cl.memory_bytes)
            spdlog::warn(
                "ranks {} do not fit: the allocated peak {} and the runtime {} are more than the GPU's {}",
                rank_ranges(r.memory[i].ranks), format_bytes(m.torch_peak),
                format_bytes(static_cast<int64_t>(r.overheads[i].outside_allocator())),
                format_bytes(static_cast<int64_t>(cl.memory_bytes - cl.reserved_bytes)));
        else if (m.over_capacity > 0)
            spdlog::warn(
                "ranks {}: PyTorch's caching allocator runs out of memory even after giving its cache back "
                "({} segment{} beyond the GPU's memory; fragmentation: the allocated peak {} fits, its "
                "segments do not)",
                rank_ranges(r.memory[i].ranks), m.over_capacity, m.over_capacity == 1 ? "" : "s",
                format_bytes(m.torch_peak));
    }
}

void print_modules(const Explanation& ex) {
    if (ex.modules.empty()) return;
    std::vector<std::vector<std::string>> rows = {{"module", "pattern", "style", "input", "output"}};
    for (const auto& m : ex.modules)
        rows.push_back({m.fqn.empty() ? "(root)" : m.fqn, m.pattern.empty() ? "\"\"" : m.pattern, m.style,
                        shape_str(m.input), shape_str(m.output)});
    fmt::print("\n");
    print_columns(rows, "  ");
    rows = {{"parameter", "placement", "full", "local per rank"}};
    for (const auto& m : ex.modules)
        for (const auto& p : m.params)
            rows.push_back({p.fqn, p.placement.str(), shape_str(p.full), local_shapes(p)});
    if (rows.size() > 1) fmt::print("\n"), print_columns(rows, "  ");
}

void print_parallel_dims(const ExplainReport& r) {  // data parallel, expert parallel, the pipeline
    const Explanation& ex = r.ex;
    const Plan& plan = r.plan;
    if (!ex.data_parallel.empty()) fmt::print("\n  data parallel ({}):\n", r.data_parallel_title);
    for (const std::string& line : ex.data_parallel) fmt::print("    {}\n", line);
    if (!ex.expert_parallel.empty())
        fmt::print("\n  expert parallel (over '{}', {} ranks):\n", plan.dims.name(DimRole::ep),
                   plan.dims.size(DimRole::ep));
    for (const std::string& line : ex.expert_parallel) fmt::print("    {}\n", line);
    if (!plan.pipeline) return;
    const int p = plan.dims.size(DimRole::pp);
    const int64_t rounds = plan.accumulation_rounds(r.model);
    fmt::print(
        "\n  pipeline ({} over '{}': {} stages on {} pp ranks, {} microbatches a round, {} round{}; "
        "bubble "
        "{:.1f}% at uniform stages, F = I = W):\n",
        schedule_kind_name(plan.pipeline->schedule), plan.dims.name(DimRole::pp), plan.pipeline_stages(), p,
        plan.microbatches_per_round(), rounds, rounds == 1 ? "" : "s", 100 * r.bubble_closed_form);
    std::vector<std::vector<std::string>> rows = {
        {"stage", "ranks", "modules", "in flight", "its ranks' sends per step", "receives per step"}};
    for (const StageExplain& st : r.stages)
        rows.push_back({std::to_string(st.stage), rank_ranges(st.ranks),
                        st.first == st.last ? st.first : fmt::format("{} .. {}", st.first, st.last),
                        std::to_string(st.in_flight),
                        st.sends ? fmt::format("{} x {}", st.sends, format_bytes(st.send_bytes / st.sends))
                                 : std::string("none"),
                        st.recvs ? fmt::format("{} x {}", st.recvs, format_bytes(st.recv_bytes / st.recvs))
                                 : std::string("none")});
    print_columns(rows, "    ");
}

void print_collectives(const ExplainReport& r) {
    const Explanation& ex = r.ex;
    fmt::print("\n  collectives per training step (per rank; bytes of the logical tensor):\n");
    std::map<Collective, std::pair<int64_t, int64_t>> totals;  // in the names' order (comm/collective.h)
    std::vector<std::vector<std::string>> rows;
    for (const auto& cc : ex.step_comm) {
        rows.push_back({phase_name(cc.phase), cc.module.empty() ? "(root)" : cc.module,
                        collective_name(cc.op), format_bytes(cc.bytes)});
        totals[cc.op].first += 1, totals[cc.op].second += cc.bytes;
    }
    print_columns(rows, "    ");
    if (ex.step_comm.empty()) fmt::print("    none\n");
    std::vector<std::string> t;
    for (const auto& [op, v] : totals)
        t.push_back(fmt::format("{} x{} ({})", collective_name(op), v.first, format_bytes(v.second)));
    fmt::print("  total: {}\n", t.empty() ? std::string("none") : fmt::format("{}", fmt::join(t, ", ")));
    fmt::print("  at start: {}\n",
               r.at_start.empty() ? std::string("none") : fmt::format("{}", fmt::join(r.at_start, "; ")));
}

// The memory table and its terms (cli/explain_terms.h), whether each rank class fits the GPU, and
// what verify keeps on the host
void print_memory_section(const ExplainReport& r) {
    print_memory(r);
    if (r.cluster) warn_fit(r);
    fmt::print(
        "  verify keeps on the host: the reference's record, {} step{} x {} = {} (every tensor it compares, "
        "full size:\n"
        "  parameters, gradients, buffers, output, and each module's output and input gradient; `verify "
        "--steps` changes it)\n",
        r.steps, r.steps == 1 ? "" : "s", format_bytes(r.ex.record_step_bytes),
        format_bytes(r.steps * r.ex.record_step_bytes));
}

void print_time(const ExplainReport& r) {
    const Cluster& cluster = *r.cluster;
    const Plan& plan = r.plan;
    const DType compute = plan.compute_dtype(r.model.dtype);
    fmt::print("\n  time per step on {} ({} x {} GPUs; the last simulated step; docs/planning.md):\n",
               cluster.name, cluster.nodes, cluster.gpus_per_node);
    if (plan.world_size() > cluster.world_size())
        spdlog::warn("the plan's {} ranks are more than the cluster's {} GPUs", plan.world_size(),
                     cluster.world_size());
    std::vector<std::vector<std::string>> rows = {{"ranks", "compute", "communication", "step", "MFU"}};
    for (size_t i = 0; i < r.memory.size(); ++i) {
        const StepTime& t = r.times[i];
        std::vector<std::string> comm;
        for (const auto& [dim, ct] : t.by_dim)
            comm.push_back(fmt::format("{} {:.1f} ms ({}, {})", dim, ct.seconds * 1e3,
                                       format_bytes(static_cast<int64_t>(ct.bytes)),
                                       ct.inter_node ? "inter-node" : "intra-node"));
        rows.push_back({rank_ranges(r.memory[i].ranks), fmt::format("{:.1f} ms", t.compute * 1e3),
                        comm.empty() ? "none" : fmt::format("{}", fmt::join(comm, ", ")),
                        fmt::format("{:.1f} ms", t.step * 1e3),
                        fmt::format("{:.1f}%", 100 * mfu(t, cluster, compute))});
    }
    print_columns(rows, "    ");
    if (plan.pipeline && !r.times.empty())
        fmt::print(
            "    (pipeline: the schedule's critical path {:.1f} ms, action by action over the stages; "
            "bubble "
            "{:.1f}% of the busiest rank's work, {:.1f}% at uniform stages)\n",
            r.times.front().pipeline * 1e3, 100 * r.times.front().bubble, 100 * r.bubble_closed_form);
    fmt::print(
        "    (data-parallel collectives overlap the compute, tensor-parallel ones do not; MFU: the "
        "step's GEMM\n"
        "     FLOPs, activation checkpointing's recompute not counted, over the peak)\n");
    print_compute_terms(r);
}

}  // namespace

std::string rank_ranges(const std::vector<int>& ranks) {
    std::vector<std::string> parts;
    for (size_t i = 0; i < ranks.size();) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        parts.push_back(j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
        i = j + 1;
    }
    return fmt::format("{}", fmt::join(parts, ", "));
}

void print_explain(const ExplainReport& r, const std::string& model_path, const std::string& plan_path) {
    const Explanation& ex = r.ex;
    for (const auto& w : ex.resolution.warnings) spdlog::warn("{}", w.str());
    fmt::print("ptool explain {} {}: {}\n", model_path, plan_path, fmt::join(r.summary, ", "));
    fmt::print("  loss: {}\n", r.loss);
    for (const Diagnostic& c : ex.resolution.causes) fmt::print("  expect a mismatch: {}\n", c.str());
    print_modules(ex);
    print_parallel_dims(r);
    print_collectives(r);
    print_memory_section(r);
    if (r.cluster) print_time(r);
}

}  // namespace ptool::cli
