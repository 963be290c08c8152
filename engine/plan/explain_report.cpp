#include "plan/explain_report.h"

#include <algorithm>
#include <map>

#include "core/device_memory.h"
#include "parallel/device_mesh.h"
#include "plan/kernel_table.h"
#include "plan/pipeline_search.h"
#include "plan/pipeline_time.h"
#include "train/stage.h"

namespace ptool {

std::vector<std::string> describe_dims(const Plan& plan) {
    std::vector<std::string> out;
    const ParallelDims& dims = plan.dims;
    if (dims.has(DimRole::tp))
        out.push_back(fmt::format("tensor parallel over '{}' ({} ranks)", dims.name(DimRole::tp),
                                  dims.size(DimRole::tp)));
    if (plan.data_parallel)
        out.push_back(fmt::format("data parallel over '{}' ({} ranks)", plan.data_parallel->mesh_dim_names(),
                                  dims.data_size()));
    if (plan.pipeline)
        out.push_back(
            fmt::format("pipeline over '{}' ({} stages, {}, {} microbatches a round{})",
                        dims.name(DimRole::pp), plan.pipeline_stages(),
                        schedule_kind_name(plan.pipeline->schedule), plan.microbatches_per_round(),
                        plan.pipeline->scatter_gather ? ", sends whole on tp scattered over it" : ""));
    if (plan.expert_parallel)
        out.push_back(fmt::format("expert parallel over '{}' ({} ranks, borrowed from data parallel)",
                                  dims.name(DimRole::ep), dims.size(DimRole::ep)));
    return out;
}

namespace {

// The most microbatches a stage has run forward and not yet backward, in its list (a split
// backward's microbatch until its W).
int most_in_flight(const std::vector<Action>& list) {
    int now = 0, most = 0;
    for (const Action& a : list) {
        if (a.kind == ActionKind::forward) most = std::max(most, ++now);
        if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) --now;
    }
    return most;
}

void explain_stages(ExplainReport& r) {
    const Plan& plan = r.plan;
    const PipelineSpec& spec = *plan.pipeline;
    const std::vector<Module*> spine = model_spine(r.model);
    const std::vector<StageRange> ranges = pipeline_stage_ranges(r.model, spine, plan);
    const std::vector<std::string> names = spine_names(r.model);
    const int pp_dim = plan.dims.index(DimRole::pp);
    const int m = plan.microbatches_per_round(), rounds = static_cast<int>(plan.accumulation_rounds(r.model));
    const Schedule schedule =
        pipeline_schedule(spec.schedule, plan.pipeline_stages(), m, rounds, spec.virtual_stages);
    for (size_t s = 0; s < ranges.size(); ++s) {
        StageExplain st;
        st.stage = static_cast<int>(s);
        st.first = names[ranges[s].begin], st.last = names[ranges[s].end - 1];
        const int rank = schedule.rank_of(static_cast<int>(s));
        st.in_flight = most_in_flight(schedule.ranks[rank]);
        for (const PredictedRank& pr : r.memory) {
            if (DeviceMesh::coords_of(pr.ranks.front(), plan.mesh())[pp_dim] != rank) continue;
            st.ranks.insert(st.ranks.end(), pr.ranks.begin(), pr.ranks.end());
            if (st.sends + st.recvs > 0) continue;  // one rank's
            for (const auto& [key, totals] : pr.sim.step_comm.entries()) {
                if (std::get<0>(key) == Collective::send)
                    st.sends += totals.calls, st.send_bytes += totals.bytes;
                if (std::get<0>(key) == Collective::recv)
                    st.recvs += totals.calls, st.recv_bytes += totals.bytes;
            }
        }
        std::sort(st.ranks.begin(), st.ranks.end());
        r.stages.push_back(std::move(st));
    }
    r.bubble_closed_form =
        uniform_bubble(spec.schedule, plan.pipeline_stages(), static_cast<int>(m), spec.virtual_stages);
}

}  // namespace

// explain's simulation, bounded before it starts (docs/planning.md, "What explain costs"): each
// rank class builds the model and runs its step on meta tensors, its modules (a pp rank's share
// of them) forward and backward once per microbatch and simulated step. A module built costs about
// 16 module calls here; past kExplainWork units of that, InputError at the plan, naming the
// product and the fix.
constexpr int64_t kExplainWork = int64_t{1} << 22;
constexpr int64_t kBuildWeight = 16;

void check_explain_work(const Model& model, const Plan& plan, int64_t simulated_steps) {
    const int64_t classes = static_cast<int64_t>(rank_classes(model, plan).size()),
                  modules = modules_under(*model.root), pp = plan.dims.size(DimRole::pp),
                  held = (modules + pp - 1) / pp,
                  microbatches = plan.accumulation_rounds(model) * plan.microbatches_per_round();
    const double work = static_cast<double>(classes) *
                        static_cast<double>(kBuildWeight * modules + held * microbatches * simulated_steps);
    if (work <= static_cast<double>(kExplainWork)) return;
    const SourceLocation at =
        plan.pipeline
            ? (plan.pipeline->microbatches > 0 ? plan.pipeline->microbatches_where : plan.pipeline->where)
        : plan.gradient_accumulation > 0 ? plan.gradient_accumulation_where
                                         : SourceLocation{plan.path, 1, 1};
    throw InputError(
        at, fmt::format("explain would simulate {} rank class{}{}, each building the model's {} modules and "
                        "running {}{} for {} microbatch{} x {} steps: {:.0f} units of work (a module built "
                        "counts {}, a module's forward and backward of one microbatch 1), over ptool's bound "
                        "of {}: explain it with fewer {}, or a proxy of the model (ptool shrink)",
                        classes, classes == 1 ? "" : "es", pp > 1 ? " (one per pp rank at least)" : "",
                        modules, pp > 1 ? fmt::format("its pp rank's {}", held) : std::string("them"),
                        pp > 1 ? " of them" : "", microbatches, microbatches == 1 ? "" : "es",
                        simulated_steps, work, kBuildWeight, kExplainWork,
                        pp > 1 ? "microbatches or pp ranks" : "microbatches, rank classes or layers"));
}

namespace {

// Where the framework tally (core/framework_memory.h) rounds PyTorch's allocations up: a
// fully_shard unit's unsharded gradients exist from its backward's start (PyTorch's are born weight
// by weight as autograd computes them), and the microbatch's output is held to the step's end
// (the optimizer's step too), as a training loop that keeps the model's return value does (`out =
// model(...); out.loss.backward(); opt.step()`; torchtitan's `del pred` frees it after the loss).
std::vector<MemoryAssumption> memory_assumptions(const ExplainReport& r) {
    std::vector<MemoryAssumption> out;
    const DType compute = r.plan.compute_dtype(r.model.dtype);
    const double bytes = static_cast<double>(dtype_size(compute));
    const int tp = std::max(1, r.ex.tp);
    double unit = 0;
    std::string unit_name;
    const auto params = r.model.named_parameters();
    std::map<std::string, int64_t> numel;
    for (const auto& [name, p] : params) numel[name] = p->value.numel();
    for (const FsdpUnitSpec& u : r.ex.resolution.dp.units) {
        double b = 0;
        for (const std::string& p : u.params)
            if (auto it = numel.find(p); it != numel.end()) b += static_cast<double>(it->second) * bytes / tp;
        if (b > unit) unit = b, unit_name = u.fqn.empty() ? "(root)" : u.fqn;
    }
    if (unit > 0)
        out.push_back({fmt::format("a fully_shard unit's unsharded gradients exist from its backward's start "
                                   "(PyTorch's are born weight by weight); the largest unit, {}",
                                   unit_name),
                       unit});
    if (r.model.loss == LossKind::cross_entropy) {
        const double logits = static_cast<double>(numel_of(r.ex.resolution.layouts.output.global)) * bytes /
                              (r.plan.loss_parallel ? tp : 1);
        out.push_back(
            {"the output (logits) held to the step's end, as a loop that keeps the model's return "
             "value (out = model(...); out.loss.backward(); opt.step()); torchtitan's `del pred` frees "
             "it after the loss",
             logits});
    }
    return out;
}

}  // namespace

std::string describe_loss(const Model& model, const Plan& plan) {
    const int64_t microbatches = plan.accumulation_rounds(model) * plan.microbatches_per_round();
    const int ranks = plan.dims.data_size() * (plan.context_parallel ? plan.dims.size(DimRole::cp) : 1);
    const bool ce = model.loss == LossKind::cross_entropy;
    const std::string kind =
        ce ? fmt::format("cross_entropy (ignore_index {})", model.ignore_index) : loss_name(model.loss);
    const std::string items = ce ? "valid targets" : "elements";
    const std::string said = plan.loss_normalization ? "the plan's" : "the model's";
    // who reduces the gradients over those ranks: a cp-only plan has no data parallel
    const bool cp = plan.context_parallel && plan.dims.size(DimRole::cp) > 1, dp = plan.dims.data_size() > 1;
    const std::string reducer = cp && dp ? "data and context parallel"
                                : cp     ? "context parallel"
                                         : "data parallel";
    const std::string averages = reducer + (cp && dp ? " average" : " averages"),
                      sums = reducer + (cp && dp ? " sum" : " sums");
    if (model.loss == LossKind::sum)
        return fmt::format("{}: each call's sum{}", kind,
                           ranks > 1 ? fmt::format("; {} the ranks' gradients", averages) : "");
    if (plan.normalization(model) == LossNormalization::global_tokens)
        return fmt::format(
            "{}, loss_normalization global_tokens ({}): each call's sum over its {} divided by "
            "the step's count over {} rank{} x {} microbatch{} (one all_reduce{}){}",
            kind, said, items, ranks, ranks == 1 ? "" : "s", microbatches, microbatches == 1 ? "" : "es",
            ranks > 1 ? "" : ", none here: one rank",
            ranks > 1 ? fmt::format("; {} the ranks' gradients (no division)", sums) : "");
    return fmt::format("{}, loss_normalization mean_per_call ({}): each call's mean over its own {}{}{}",
                       kind, said, items,
                       microbatches > 1 ? fmt::format(", / {} microbatches", microbatches) : "",
                       ranks > 1 ? fmt::format("; {} the {} ranks' gradients (with targets "
                                               "masked unevenly not the one-device mean: global_tokens is)",
                                               averages, ranks)
                                 : "");
}

ExplainReport explain_report(const ExplainInputs& in) {
    RunInputs run;
    run.model_path = in.model_path;
    run.model_text = in.model_text;
    run.dtype_override = in.dtype;
    ExplainReport r;
    {
        MetaAllocation meta;  // shapes only: no parameter is allocated
        r.model = load_model_text(in.model_text, in.model_path, in.dtype, false);
    }
    r.plan = load_plan(in.plan_path);
    apply_mesh_flags(r.plan, in.mesh);
    if (!in.cluster_path.empty()) r.cluster = load_cluster(in.cluster_path);
    if (r.cluster && r.plan.float8 && !r.cluster->has_float8())  // the plan's section, the cluster's why
        throw InputError(
            r.plan.float8->where,
            fmt::format("float8: {}: its linears cannot run in float8 there", r.cluster->no_float8()));
    // resolved once: the explanation works on a copy, every rank class's simulation rebinds it
    const Resolution resolution = resolve_plan(r.model, r.plan);
    r.ex = explain_plan(r.model, r.plan, &resolution);
    r.float8_linears = float8_linears(resolution);
    r.float8_all_gather = float8_all_gathers(r.plan, resolution.dp);
    r.steps = r.plan.verify.steps > 0 ? r.plan.verify.steps : r.model.steps;
    // the steady state (kSteadyStateSteps: the allocator's segments too), at most 4
    r.simulated_steps = std::clamp<int64_t>(r.steps, kSteadyStateSteps, 4);
    check_explain_work(r.model, r.plan, r.simulated_steps);
    size_t capacity = 0;  // the allocator model's (train/simulate.h); 0: unbounded, without a cluster
    if (r.cluster) {
        const double left = r.cluster->memory_bytes - r.cluster->reserved_bytes -
                            worst_device_overheads(*r.cluster, r.plan).total();
        capacity = left >= 1 ? static_cast<size_t>(left) : 1;
    }
    r.memory = predict_ranks(run, r.model, r.plan, r.simulated_steps, 0, capacity, &resolution);
    if (r.cluster) {
        for (PredictedRank& pr : r.memory) {
            r.overheads.push_back(device_overheads(*r.cluster, r.plan, pr.ranks.front()));
            // PyTorch's cuBLAS workspaces come from its caching allocator, each its own segment, kept
            const auto workspaces = static_cast<int64_t>(r.overheads.back().cublas_workspaces);
            pr.sim.memory.torch_peak += workspaces, pr.sim.memory.reserved_peak += workspaces;
            pr.sim.memory.torch_first_step_peak += workspaces;
            pr.sim.memory.torch_at_peak[static_cast<int>(MemoryUse::workspace)] += workspaces;
        }
        const DType compute = r.plan.compute_dtype(r.model.dtype);
        for (const PredictedRank& pr : r.memory)
            r.times.push_back(predict_step_time(pr.sim.step_work, by_op_dim(pr.sim.step_comm), r.plan,
                                                *r.cluster, compute));
        if (r.plan.pipeline) time_pipeline(r.times, r.memory, r.plan, *r.cluster, compute);
        r.kernel_source = kernel_model_source(*r.cluster);
    }
    r.assumptions = memory_assumptions(r);

    std::vector<std::string> mesh;
    for (const auto& m : r.plan.mesh()) mesh.push_back(fmt::format("{}={}", m.name, m.size));
    r.summary.push_back(fmt::format("mesh {}", fmt::join(mesh, " x ")));
    for (std::string& line : describe_dims(r.plan)) r.summary.push_back(std::move(line));
    if (!r.float8_linears.empty()) {  // torchao's Float8Linear
        const DType compute = r.plan.compute_dtype(r.model.dtype);
        const KernelTable* k = r.cluster ? r.cluster->kernels.get() : nullptr;
        const DType rows =
            k ? k->gemm_dtype_for(compute) : compute;  // the rows that price it (kernel_model.cpp)
        const std::string priced =
            !r.cluster ? ""
            : !k       ? "; their GEMMs at the roofline's rate (the cluster has no kernel table)"
            : k->has_float8_gemm(rows)
                ? fmt::format("; their GEMMs at the kernel table's float8 rows writing {}", dtype_name(rows))
                : fmt::format("; their GEMMs priced as {} (the kernel table has no float8 rows writing it)",
                              dtype_name(rows));
        const Float8Spec& f = *r.plan.float8;
        const std::string gather =
            r.float8_all_gather
                ? fmt::format("; fully_shard gathers their weights in float8, one byte an element{}",
                              f.precompute_scale ? ", scales precomputed after the optimizer step" : "")
            : f.fsdp_float8_all_gather
                ? "; enable_fsdp_float8_all_gather: no fully_shard over several ranks here"
                : "";
        const std::string compiled = r.plan.compile ? "; torch.compile: their casts priced fused" : "";
        r.summary.push_back(fmt::format("float8 {} on {} linears ({}{}{}{}: docs/float8.md)",
                                        float8_recipe_name(f.recipe), r.float8_linears.size(),
                                        float8_recipe_casts(f.recipe), priced, gather, compiled));
    }
    if (r.plan.gradient_accumulation > 0)  // the training layout the plan carries, over the model's
        r.summary.push_back(fmt::format("gradient_accumulation {} (the plan's; the model says {})",
                                        r.plan.gradient_accumulation, r.model.gradient_accumulation));
    else if (r.model.gradient_accumulation > 1)
        r.summary.push_back(
            fmt::format("gradient_accumulation {} (the model's)", r.model.gradient_accumulation));
    r.summary.push_back(fmt::format("model input {}", r.ex.resolution.input_placement.str()));
    r.loss = describe_loss(r.model, r.plan);

    const Plan& plan = r.plan;
    if (plan.pipeline) explain_stages(r);
    if (plan.dims.has(DimRole::tp))
        r.at_start.push_back(
            plan.src_data_rank
                ? fmt::format("parameters of styled modules broadcast from tp rank {}", *plan.src_data_rank)
                : std::string("no broadcast for tensor parallel (src_data_rank: null)"));
    if (plan.data_parallel && !r.ex.resolution.dp.replicas.empty())
        r.at_start.push_back(fmt::format("replicate()'s parameters{} broadcast from {} rank 0",
                                         r.ex.resolution.dp.synced_buffers.empty() ? "" : " and buffers",
                                         plan.data_parallel->mesh_dim_names()));
    if (plan.data_parallel)
        r.data_parallel_title = plan.data_parallel->hybrid()
                                    ? std::string("fully_shard over 2 dims (HSDP)")
                                    : std::string(data_parallel_mode_name(plan.data_parallel->mode));
    return r;
}

}  // namespace ptool
