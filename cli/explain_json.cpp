// `ptool explain --json`: the report as one document (docs/schema/explain.schema.json), built
// section by section.
#include <map>

#include "cli/explain_output.h"
#include "cli/explain_terms.h"
#include "cli/verify_output.h"

namespace ptool::cli {
namespace {

using nlohmann::json;

// Every module call of the step, as the layout pass saw it (what mutation_score.py reads to find
// where a fault class applies): its layouts, its own parameters, checkpointed or not; and the
// parameters more than one module uses ("tied").
void add_calls(json& j, const Model& model, const Resolution& res) {
    std::map<const Parameter*, std::vector<std::string>> users;
    j["calls"] = json::array();
    for (const CallLayout& c : res.layouts.calls) {
        std::vector<std::string> own;
        for (const auto& e : c.module->params()) {
            own.push_back(join_name(c.fqn, e.name));
            auto& u = users[e.param.get()];
            if (std::find(u.begin(), u.end(), c.fqn) == u.end()) u.push_back(c.fqn);
        }
        json call = {
            {"fqn", c.fqn},       {"type", c.module->type()},
            {"in", c.in.p.str()}, {"out", c.out.p.str()},
            {"params", own},      {"checkpointed", res.checkpointing.checkpointed.count(c.module) > 0}};
        if (const std::string mode = res.checkpointing.mode_of(c.module); !mode.empty())
            call["recompute"] = mode;
        if (const auto p = c.module->drop_probability()) call["p"] = *p;
        if (const AttentionCore* a = c.module->attention_core()) call["causal"] = a->causal();
        j["calls"].push_back(call);
    }
    j["tied"] = json::array();
    for (const auto& [name, p] : model.named_parameters())
        if (users[p.get()].size() > 1) j["tied"].push_back({{"param", name}, {"modules", users[p.get()]}});
}

void add_modules(json& j, const Model& model, const Explanation& ex) {
    j["modules"] = json::array();
    for (const auto& m : ex.modules) {
        std::vector<std::string> params;
        for (const auto& p : m.params) params.push_back(p.fqn);
        std::string type;
        for_each_module(*model.root, [&](const std::string& fqn, Module& mod) {
            if (fqn == m.fqn) type = mod.type();
        });
        j["modules"].push_back({{"fqn", m.fqn}, {"style", m.style}, {"type", type}, {"params", params}});
    }
    j["params"] = json::array();
    int64_t elements = 0;
    for (const auto& [name, p] : model.named_parameters())
        j["params"].push_back(name), elements += p->value.numel();
    j["parameters"] = elements;  // unique parameter elements
}

// The loss, precision and the parallel dims' own resolutions: tp, dp (its buckets and units), cp, ep.
void add_parallel(json& j, const ExplainReport& r) {
    const Model& model = r.model;
    const Plan& plan = r.plan;
    const Resolution& res = r.ex.resolution;
    j["loss_parallel"] = plan.loss_parallel;
    j["loss"] = {{"kind", loss_name(model.loss)},
                 {"ignore_index", model.ignore_index},
                 {"normalization", loss_normalization_name(plan.normalization(model))},
                 {"text", r.loss}};
    j["masked_targets"] = model.target_mask.has_value();
    j["clip_grad_norm"] = model.clip_grad_norm;
    j["mixed_precision"] =
        plan.mixed_precision ? json(dtype_name(plan.mixed_precision->param_dtype)) : json(nullptr);
    j["src_data_rank"] =
        plan.dims.has(DimRole::tp) && plan.src_data_rank ? json(*plan.src_data_rank) : json(nullptr);
    j["tp"] = r.ex.tp;
    j["dp"] = r.ex.dp;
    j["context_parallel"] =
        plan.context_parallel
            ? json{{"cp", plan.dims.size(DimRole::cp)},
                   {"load_balance", plan.context_parallel->load_balance},
                   {"rotate_method",
                    plan.context_parallel->rotate == RotateMethod::alltoall ? "alltoall" : "allgather"}}
            : json(nullptr);
    j["float8"] = plan.float8
                      ? json{{"recipe", float8_recipe_name(plan.float8->recipe)},
                             {"linears", r.float8_linears},
                             {"fsdp_float8_all_gather", r.float8_all_gather},
                             {"precompute_scale", r.float8_all_gather && plan.float8->precompute_scale}}
                      : json(nullptr);
    const ExpertParallelResolution& ep = res.ep;
    j["expert_parallel"] =
        ep.active ? json{{"ep", ep.size}, {"mesh_dim", plan.dims.name(DimRole::ep)}, {"layers", ep.layers}}
                  : json(nullptr);
    const DataParallelResolution& dp = res.dp;
    j["buckets"] = json::array();
    for (const auto& rep : dp.replicas)
        for (const auto& b : rep.buckets) j["buckets"].push_back({{"root", rep.root}, {"params", b.params}});
    j["units"] = json::array();
    for (const auto& u : dp.units) j["units"].push_back({{"fqn", u.fqn}, {"params", u.params}});
    j["ignored_params"] = std::vector<std::string>(dp.ignored_params.begin(), dp.ignored_params.end());
    j["synced_buffers"] = std::vector<std::string>(dp.synced_buffers.begin(), dp.synced_buffers.end());
    j["zero_stage"] = dp.zero_stage;  // data_parallel's ZeRO stage (0: plain DDP or none)
}

json memory_entries(const ExplainReport& r) {  // one per rank class, predicted (train/simulate.h)
    json out = json::array();
    for (size_t i = 0; i < r.memory.size(); ++i) {
        const PredictedRank& m = r.memory[i];
        json e = memory_json(m.sim.memory, "predicted_peak_bytes");  // the steady state's
        e["first_step_peak_bytes"] = m.sim.memory.first_step_peak;
        e["predicted_reserved_peak_bytes"] = m.sim.memory.reserved_peak;  // the allocator model's
        add_memory_terms(e, r, i);  // PyTorch's allocated peak and its terms (cli/explain_terms.h)
        if (r.cluster) {            // the runtime's memory besides the tensors (plan/device_overheads.h)
            const DeviceOverheads& o = r.overheads[i];
            e["runtime_bytes"] = {{"cuda_context", o.cuda_context},
                                  {"step_runtime", o.step_runtime},
                                  {"cublas_workspaces", o.cublas_workspaces},
                                  {"nccl", o.nccl},
                                  {"nccl_communicators", o.communicators}};
            e["device_peak_bytes"] = static_cast<double>(m.sim.memory.reserved_peak) + o.outside_allocator();
            e["allocator_over_capacity"] = m.sim.memory.over_capacity;
        }
        e["ranks"] = m.ranks;
        out.push_back(e);
    }
    return out;
}

json pipeline_entry(const ExplainReport& r) {
    const Plan& plan = r.plan;
    json stages = json::array();
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
    return {{"schedule", schedule_kind_name(plan.pipeline->schedule)},
            {"stages", stages},
            {"virtual_stages", plan.pipeline->virtual_stages},
            {"scatter_gather", plan.pipeline->scatter_gather},
            {"microbatches", plan.microbatches_per_round()},
            {"rounds", plan.accumulation_rounds(r.model)},
            {"bubble_closed_form", r.bubble_closed_form}};
}

json time_entries(const ExplainReport& r) {  // per rank class, seconds
    json out = json::array();
    for (size_t i = 0; i < r.times.size(); ++i) {
        const StepTime& t = r.times[i];
        json by_dim = json::object();
        for (const auto& [dim, ct] : t.by_dim)
            by_dim[dim] = {{"seconds", ct.seconds},
                           {"bytes", ct.bytes},
                           {"calls", ct.calls},
                           {"inter_node", ct.inter_node}};
        json e = {{"ranks", r.memory[i].ranks},
                  {"compute_seconds", t.compute},
                  {"compute_terms", compute_terms_json(t.terms)},
                  {"step_seconds", t.step},
                  {"gemm_flops", t.gemm_flops},
                  {"model_flops", t.model_flops},
                  {"collectives", by_dim}};
        if (r.plan.pipeline) e["pipeline_seconds"] = t.pipeline, e["bubble"] = t.bubble;
        out.push_back(e);
    }
    return out;
}

}  // namespace

json explain_json(const ExplainReport& r, const std::string& model_path, const std::string& plan_path) {
    const Explanation& ex = r.ex;
    json j = json_document("explain");
    j["model"] = model_path;
    j["plan"] = plan_path;
    j["warnings"] = diagnostic_strings(ex.resolution.warnings);
    j["causes"] = diagnostic_strings(ex.resolution.causes);
    j["data_parallel"] = ex.data_parallel;
    j["collectives_per_step"] = json::array();
    for (const auto& cc : ex.step_comm)
        j["collectives_per_step"].push_back({{"op", collective_name(cc.op)},
                                             {"bytes", cc.bytes},
                                             {"module", cc.module},
                                             {"phase", phase_name(cc.phase)}});
    add_modules(j, r.model, ex);
    add_calls(j, r.model, ex.resolution);
    add_parallel(j, r);
    j["memory"] = memory_entries(r);
    j["verify_record_bytes_per_step"] = ex.record_step_bytes;
    j["verify_steps"] = r.steps;
    j["simulated_steps"] = r.simulated_steps;
    // the step's rounds of gradient accumulation and whose they are (the plan's key overrides the
    // model's)
    j["gradient_accumulation"] = r.plan.accumulation_rounds(r.model);
    j["gradient_accumulation_from"] = r.plan.gradient_accumulation > 0 ? "plan" : "model";
    if (r.plan.pipeline) j["pipeline"] = pipeline_entry(r);
    if (r.cluster) j["time"] = time_entries(r);
    return j;
}

}  // namespace ptool::cli
