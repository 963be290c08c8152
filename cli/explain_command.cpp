// ptool explain MODEL PLAN: lint the plan and show what it does per rank, without running ranks.
#include <spdlog/spdlog.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "cli/commands.h"
#include "cli/verify_output.h"
#include "core/file_roles.h"
#include "core/safetensors.h"
#include "core/yaml_reader.h"
#include "plan/explain_report.h"

namespace ptool::cli {
namespace {

struct ExplainArgs {
    std::string model, plan, json, cluster;
    std::vector<std::string> mesh;
};

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

std::string rank_ranges(const std::vector<int>& ranks) {  // ascending: "0-3, 8-11"
    std::vector<std::string> parts;
    for (size_t i = 0; i < ranks.size();) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        parts.push_back(j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
        i = j + 1;
    }
    return fmt::format("{}", fmt::join(parts, ", "));
}

// The runtime's memory per GPU (plan/device_overheads.h) and, per rank class, whether the peak fits.
void print_runtime(const ExplainReport& r) {
    const Cluster& cl = *r.cluster;
    std::set<int> communicators;
    for (const DeviceOverheads& o : r.overheads) communicators.insert(o.communicators);
    fmt::print(
        "  runtime per GPU ({}'s `runtime`): CUDA context {}, cuBLAS workspace {}, NCCL {} per communicator "
        "x {} communicators;\n  GPU memory {}, reserve {}\n",
        cl.name, format_bytes(static_cast<int64_t>(cl.runtime.cuda_context)),
        format_bytes(static_cast<int64_t>(cl.runtime.cublas_workspace)),
        format_bytes(static_cast<int64_t>(cl.runtime.nccl_per_communicator)),
        fmt::join(communicators, " or "), format_bytes(static_cast<int64_t>(cl.memory_bytes)),
        format_bytes(static_cast<int64_t>(cl.reserved_bytes)));
    for (size_t i = 0; i < r.memory.size(); ++i) {
        const RankMemory& m = r.memory[i].sim.memory;
        const double needs = static_cast<double>(m.peak) + r.overheads[i].total() + cl.reserved_bytes;
        if (needs > cl.memory_bytes)
            spdlog::warn("ranks {} do not fit: the peak {} and the runtime {} are more than the GPU's {}",
                         rank_ranges(r.memory[i].ranks), format_bytes(m.peak),
                         format_bytes(static_cast<int64_t>(r.overheads[i].total())),
                         format_bytes(static_cast<int64_t>(cl.memory_bytes - cl.reserved_bytes)));
        else if (m.over_capacity > 0)
            spdlog::warn(
                "ranks {}: PyTorch's caching allocator runs out of memory even after giving its cache back "
                "({} segment{} beyond the GPU's memory; fragmentation: the peak {} fits, its segments do "
                "not)",
                rank_ranges(r.memory[i].ranks), m.over_capacity, m.over_capacity == 1 ? "" : "s",
                format_bytes(m.peak));
    }
}

void explain(const ExplainArgs& a, const Common& c) {
    FileRoles()
        .input("MODEL", a.model)
        .input("PLAN", a.plan)
        .input("--cluster", a.cluster)
        .output("--json", a.json)
        .check();
    if (!a.json.empty()) check_output(a.json, true);
    ExplainInputs in;
    in.model_path = a.model;
    in.model_text = read_file(a.model, YamlLimits{}.max_bytes);
    in.dtype = c.dtype;
    in.plan_path = a.plan;
    in.mesh = a.mesh;
    in.cluster_path = a.cluster;
    const ExplainReport r = explain_report(in);
    const Model& model = r.model;
    const Plan& plan = r.plan;
    const Explanation& ex = r.ex;
    const int64_t steps = r.steps;
    const std::vector<PredictedRank>& memory = r.memory;
    for (const auto& w : ex.resolution.warnings) spdlog::warn("{}", w.str());
    const std::vector<std::string>& parts = r.summary;
    fmt::print("ptool explain {} {}: {}\n", a.model, a.plan, fmt::join(parts, ", "));
    fmt::print("  loss: {}\n", r.loss);
    for (const Diagnostic& c : ex.resolution.causes) fmt::print("  expect a mismatch: {}\n", c.str());
    if (!ex.modules.empty()) {
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
    if (!ex.data_parallel.empty()) fmt::print("\n  data parallel ({}):\n", r.data_parallel_title);
    for (const std::string& line : ex.data_parallel) fmt::print("    {}\n", line);
    if (!ex.expert_parallel.empty())
        fmt::print("\n  expert parallel (over '{}', {} ranks):\n", plan.dims.name(DimRole::ep),
                   plan.dims.size(DimRole::ep));
    for (const std::string& line : ex.expert_parallel) fmt::print("    {}\n", line);
    if (plan.pipeline) {
        const int p = plan.dims.size(DimRole::pp);
        fmt::print(
            "\n  pipeline ({} over '{}': {} stages on {} pp ranks, {} microbatches a round, {} round{}; "
            "bubble "
            "(p-1)/(v m) = {:.1f}% at uniform stages):\n",
            schedule_kind_name(plan.pipeline->schedule), plan.dims.name(DimRole::pp), plan.pipeline_stages(),
            p, plan.microbatches_per_round(), plan.accumulation_rounds(model),
            plan.accumulation_rounds(model) == 1 ? "" : "s", 100 * r.bubble_closed_form);
        std::vector<std::vector<std::string>> prows = {
            {"stage", "ranks", "modules", "in flight", "its ranks' sends per step", "receives per step"}};
        for (const StageExplain& st : r.stages)
            prows.push_back(
                {std::to_string(st.stage), rank_ranges(st.ranks),
                 st.first == st.last ? st.first : fmt::format("{} .. {}", st.first, st.last),
                 std::to_string(st.in_flight),
                 st.sends ? fmt::format("{} x {}", st.sends, format_bytes(st.send_bytes / st.sends))
                          : std::string("none"),
                 st.recvs ? fmt::format("{} x {}", st.recvs, format_bytes(st.recv_bytes / st.recvs))
                          : std::string("none")});
        print_columns(prows, "    ");
    }
    fmt::print("\n  collectives per training step (per rank; bytes of the logical tensor):\n");
    std::map<std::string, std::pair<int64_t, int64_t>> totals;
    std::vector<std::vector<std::string>> rows;
    for (const auto& cc : ex.step_comm) {
        rows.push_back(
            {phase_name(cc.phase), cc.module.empty() ? "(root)" : cc.module, cc.op, format_bytes(cc.bytes)});
        totals[cc.op].first += 1, totals[cc.op].second += cc.bytes;
    }
    print_columns(rows, "    ");
    if (ex.step_comm.empty()) fmt::print("    none\n");
    std::vector<std::string> t;
    for (const auto& [op, v] : totals)
        t.push_back(fmt::format("{} x{} ({})", op, v.first, format_bytes(v.second)));
    fmt::print("  total: {}\n", t.empty() ? std::string("none") : fmt::format("{}", fmt::join(t, ", ")));
    const std::vector<std::string>& start = r.at_start;
    fmt::print("  at start: {}\n",
               start.empty() ? std::string("none") : fmt::format("{}", fmt::join(start, "; ")));
    // the steps executed on meta tensors (train/simulate.h): every tensor the ranks would hold; at
    // least two, so that the peak is the steady state's
    fmt::print(
        "\n  memory per rank (predicted: {} steps simulated; peak: the steady state, from the second step "
        "on, with the\n"
        "  optimizer's state held throughout; first step: its own peak, before that state exists; what was "
        "resident\n"
        "  before the first step; and at the peak):\n",
        r.simulated_steps);
    const bool on_gpu = r.cluster.has_value();
    std::vector<std::vector<std::string>> mrows = {{"ranks", "peak", "first step", "reserved"}};
    if (on_gpu) mrows[0].push_back("on the GPU");
    mrows[0].insert(mrows[0].end(), {"resident", "at the peak"});
    for (size_t i = 0; i < memory.size(); ++i) {
        const PredictedRank& pm = memory[i];
        const RankMemory& m = pm.sim.memory;
        std::vector<std::string> uses;
        for (int u = 0; u < kMemoryUses; ++u)
            if (m.at_peak[u] > 0)
                uses.push_back(fmt::format("{} {}", memory_use_name(static_cast<MemoryUse>(u)),
                                           format_bytes(m.at_peak[u])));
        std::vector<std::string> row = {rank_ranges(pm.ranks), format_bytes(m.peak),
                                        format_bytes(m.first_step_peak), format_bytes(m.reserved_peak)};
        if (on_gpu)
            row.push_back(format_bytes(m.reserved_peak + static_cast<int64_t>(r.overheads[i].total())));
        row.insert(row.end(), {format_bytes(m.resident), fmt::format("{}", fmt::join(uses, ", "))});
        mrows.push_back(std::move(row));
    }
    print_columns(mrows, "    ");
    fmt::print(
        "  (peak: the tensors' bytes, torch.cuda.max_memory_allocated; reserved: what PyTorch's caching "
        "allocator holds\n"
        "  for them at most, its segments and block rounding replayed, torch.cuda.max_memory_reserved{})\n",
        on_gpu ? "; on the GPU: reserved plus the runtime" : "");
    if (on_gpu) print_runtime(r);
    fmt::print(
        "  verify keeps on the host: the reference's record, {} step{} x {} = {} (every tensor it compares, "
        "full size:\n"
        "  parameters, gradients, buffers, output, and each module's output and input gradient; `verify "
        "--steps` changes it)\n",
        steps, steps == 1 ? "" : "s", format_bytes(ex.record_step_bytes),
        format_bytes(steps * ex.record_step_bytes));
    const std::vector<StepTime>& times = r.times;
    const std::optional<Cluster>& cluster = r.cluster;
    if (cluster) {
        const DType compute = plan.compute_dtype(model.dtype);
        fmt::print("\n  time per step on {} ({} x {} GPUs; the last simulated step; docs/planning.md):\n",
                   cluster->name, cluster->nodes, cluster->gpus_per_node);
        if (plan.world_size() > cluster->world_size())
            spdlog::warn("the plan's {} ranks are more than the cluster's {} GPUs", plan.world_size(),
                         cluster->world_size());
        std::vector<std::vector<std::string>> trows = {{"ranks", "compute", "communication", "step", "MFU"}};
        for (size_t i = 0; i < memory.size(); ++i) {
            const PredictedRank& pr = memory[i];
            const StepTime& t = times[i];
            std::vector<std::string> comm;
            for (const auto& [dim, ct] : t.by_dim)
                comm.push_back(fmt::format("{} {:.1f} ms ({}, {})", dim, ct.seconds * 1e3,
                                           format_bytes(static_cast<int64_t>(ct.bytes)),
                                           ct.inter_node ? "inter-node" : "intra-node"));
            trows.push_back({rank_ranges(pr.ranks), fmt::format("{:.1f} ms", t.compute * 1e3),
                             comm.empty() ? "none" : fmt::format("{}", fmt::join(comm, ", ")),
                             fmt::format("{:.1f} ms", t.step * 1e3),
                             fmt::format("{:.1f}%", 100 * mfu(t, *cluster, compute))});
        }
        print_columns(trows, "    ");
        if (plan.pipeline && !times.empty())
            fmt::print(
                "    (pipeline: the schedule's critical path {:.1f} ms, action by action over the stages; "
                "bubble "
                "{:.1f}% of the busiest rank's work, {:.1f}% at uniform stages)\n",
                times.front().pipeline * 1e3, 100 * times.front().bubble, 100 * r.bubble_closed_form);
        fmt::print(
            "    (data-parallel collectives overlap the compute, tensor-parallel ones do not; MFU: the "
            "step's GEMM\n"
            "     FLOPs, activation checkpointing's recompute not counted, over the peak)\n");
    }
    if (!a.json.empty()) {
        nlohmann::json j = json_document("explain");
        j["model"] = a.model;
        j["plan"] = a.plan;
        j["warnings"] = diagnostic_strings(ex.resolution.warnings);
        j["causes"] = diagnostic_strings(ex.resolution.causes);
        j["data_parallel"] = ex.data_parallel;
        j["collectives_per_step"] = nlohmann::json::array();
        for (const auto& cc : ex.step_comm)
            j["collectives_per_step"].push_back(
                {{"op", cc.op}, {"bytes", cc.bytes}, {"module", cc.module}, {"phase", phase_name(cc.phase)}});
        j["modules"] = nlohmann::json::array();
        for (const auto& m : ex.modules) {
            std::vector<std::string> params;
            for (const auto& p : m.params) params.push_back(p.fqn);
            std::string type;
            for_each_module(*model.root, [&](const std::string& fqn, Module& mod) {
                if (fqn == m.fqn) type = mod.type();
            });
            j["modules"].push_back({{"fqn", m.fqn}, {"style", m.style}, {"type", type}, {"params", params}});
        }
        j["params"] = nlohmann::json::array();
        for (const auto& [name, p] : model.named_parameters()) j["params"].push_back(name);
        // every module call of the step, as the layout pass saw it (what mutation_score.py reads to
        // find where a fault class applies): its layouts, its own parameters, checkpointed or not
        std::map<const Parameter*, std::vector<std::string>> users;
        j["calls"] = nlohmann::json::array();
        for (const CallLayout& c : ex.resolution.layouts.calls) {
            std::vector<std::string> own;
            for (const auto& e : c.module->params()) {
                own.push_back(join_name(c.fqn, e.name));
                auto& u = users[e.param.get()];
                if (std::find(u.begin(), u.end(), c.fqn) == u.end()) u.push_back(c.fqn);
            }
            nlohmann::json call = {
                {"fqn", c.fqn},
                {"type", c.module->type()},
                {"in", c.in.p.str()},
                {"out", c.out.p.str()},
                {"params", own},
                {"checkpointed", ex.resolution.checkpointing.checkpointed.count(c.module) > 0}};
            if (const std::string mode = ex.resolution.checkpointing.mode_of(c.module); !mode.empty())
                call["recompute"] = mode;
            if (const auto* d = dynamic_cast<const Dropout*>(c.module)) call["p"] = d->p();
            if (const auto* a = dynamic_cast<const Attention*>(c.module)) call["causal"] = a->causal();
            j["calls"].push_back(call);
        }
        j["tied"] = nlohmann::json::array();  // parameters more than one module uses
        for (const auto& [name, p] : model.named_parameters())
            if (users[p.get()].size() > 1)
                j["tied"].push_back({{"param", name}, {"modules", users[p.get()]}});
        j["loss_parallel"] = plan.loss_parallel;
        j["loss"] = {{"kind", loss_name(model.loss)},
                     {"ignore_index", model.ignore_index},
                     {"normalization", loss_normalization_name(plan.normalization(model))},
                     {"text", r.loss}};
        j["masked_targets"] = model.target_mask.has_value();
        j["clip_grad_norm"] = model.clip_grad_norm;
        j["mixed_precision"] = plan.mixed_precision
                                   ? nlohmann::json(dtype_name(plan.mixed_precision->param_dtype))
                                   : nlohmann::json(nullptr);
        j["src_data_rank"] = plan.dims.has(DimRole::tp) && plan.src_data_rank
                                 ? nlohmann::json(*plan.src_data_rank)
                                 : nlohmann::json(nullptr);
        j["tp"] = ex.tp;
        j["dp"] = ex.dp;
        j["context_parallel"] =
            plan.context_parallel
                ? nlohmann::json{{"cp", plan.dims.size(DimRole::cp)},
                                 {"load_balance", plan.context_parallel->load_balance},
                                 {"rotate_method", plan.context_parallel->rotate == RotateMethod::alltoall
                                                       ? "alltoall"
                                                       : "allgather"}}
                : nlohmann::json(nullptr);
        const ExpertParallelResolution& ep = ex.resolution.ep;
        j["expert_parallel"] = ep.active ? nlohmann::json{{"ep", ep.size},
                                                          {"mesh_dim", plan.dims.name(DimRole::ep)},
                                                          {"layers", ep.layers}}
                                         : nlohmann::json(nullptr);
        const DataParallelResolution& dp = ex.resolution.dp;
        j["buckets"] = nlohmann::json::array();
        for (const auto& r : dp.replicas)
            for (const auto& b : r.buckets) j["buckets"].push_back({{"root", r.root}, {"params", b.params}});
        j["units"] = nlohmann::json::array();
        for (const auto& u : dp.units) j["units"].push_back({{"fqn", u.fqn}, {"params", u.params}});
        j["ignored_params"] = std::vector<std::string>(dp.ignored_params.begin(), dp.ignored_params.end());
        j["synced_buffers"] = std::vector<std::string>(dp.synced_buffers.begin(), dp.synced_buffers.end());
        j["zero_stage"] = dp.zero_stage;        // data_parallel's ZeRO stage (0: plain DDP or none)
        j["memory"] = nlohmann::json::array();  // one entry per rank class, predicted (train/simulate.h)
        for (size_t i = 0; i < memory.size(); ++i) {
            const PredictedRank& m = memory[i];
            nlohmann::json e = memory_json(m.sim.memory, "predicted_peak_bytes");  // the steady state's
            e["first_step_peak_bytes"] = m.sim.memory.first_step_peak;
            e["predicted_reserved_peak_bytes"] = m.sim.memory.reserved_peak;  // the allocator model's
            if (cluster) {  // the runtime's memory besides the tensors (plan/device_overheads.h)
                const DeviceOverheads& o = r.overheads[i];
                e["runtime_bytes"] = {{"cuda_context", o.cuda_context},
                                      {"cublas_workspace", o.cublas_workspace},
                                      {"nccl", o.nccl},
                                      {"nccl_communicators", o.communicators}};
                e["device_peak_bytes"] = static_cast<double>(m.sim.memory.reserved_peak) + o.total();
                e["allocator_over_capacity"] = m.sim.memory.over_capacity;
            }
            e["ranks"] = m.ranks;
            j["memory"].push_back(e);
        }
        int64_t elements = 0;
        for (const auto& [name, p] : model.named_parameters()) elements += p->value.numel();
        j["parameters"] = elements;  // unique parameter elements
        j["verify_record_bytes_per_step"] = ex.record_step_bytes;
        j["verify_steps"] = steps;
        j["simulated_steps"] = r.simulated_steps;
        // the step's rounds of gradient accumulation and whose they are (the plan's key overrides the
        // model's)
        j["gradient_accumulation"] = plan.accumulation_rounds(model);
        j["gradient_accumulation_from"] = plan.gradient_accumulation > 0 ? "plan" : "model";
        if (plan.pipeline) {
            nlohmann::json stages = nlohmann::json::array();
            for (const StageExplain& st : r.stages)
                stages.push_back({{"stage", st.stage},
                                  {"ranks", st.ranks},
                                  {"first", st.first},
                                  {"last", st.last},
                                  {"in_flight", st.in_flight},
                                  {"sends", st.sends},
                                  {"send_bytes", st.send_bytes},
                                  {"recvs", st.recvs},
                                  {"recv_bytes", st.recv_bytes}});
            j["pipeline"] = {{"schedule", schedule_kind_name(plan.pipeline->schedule)},
                             {"stages", stages},
                             {"virtual_stages", plan.pipeline->virtual_stages},
                             {"microbatches", plan.microbatches_per_round()},
                             {"rounds", plan.accumulation_rounds(model)},
                             {"bubble_closed_form", r.bubble_closed_form}};
        }
        if (cluster) {
            j["time"] = nlohmann::json::array();  // per rank class, seconds
            for (size_t i = 0; i < times.size(); ++i) {
                nlohmann::json by_dim = nlohmann::json::object();
                for (const auto& [dim, ct] : times[i].by_dim)
                    by_dim[dim] = {{"seconds", ct.seconds},
                                   {"bytes", ct.bytes},
                                   {"calls", ct.calls},
                                   {"inter_node", ct.inter_node}};
                j["time"].push_back({{"ranks", memory[i].ranks},
                                     {"compute_seconds", times[i].compute},
                                     {"step_seconds", times[i].step},
                                     {"gemm_flops", times[i].gemm_flops},
                                     {"model_flops", times[i].model_flops},
                                     {"collectives", by_dim}});
                if (plan.pipeline)
                    j["time"].back()["pipeline_seconds"] = times[i].pipeline,
                    j["time"].back()["bubble"] = times[i].bubble;
            }
        }
        write_file(a.json, j.dump(2) + "\n", true);
    }
}

}  // namespace

void add_explain_command(CLI::App& app, Common& common) {
    auto a = std::make_shared<ExplainArgs>();
    CLI::App* cmd = app.add_subcommand(
        "explain",
        "Lint PLAN for MODEL, then show styles, placements, local shapes, collectives and memory per rank");
    cmd->add_option("MODEL", a->model, "model YAML file")->required();
    cmd->add_option("PLAN", a->plan, "plan YAML file")->required();
    cmd->add_option("--dtype", common.dtype, "override the model's dtype");
    cmd->add_option("--json", a->json, "write the collectives and memory as JSON")->check(output_path());
    cmd->add_option("--cluster", a->cluster, "predict the step time on this cluster (clusters/*.yaml)");
    cmd->add_option("--mesh", a->mesh, "resize a mesh dim of the plan, e.g. --mesh tp=8 (repeatable)");
    cmd->callback([a, &common] { explain(*a, common); });
}

}  // namespace ptool::cli
