#include "plan/explain_report.h"

#include "core/device_memory.h"

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
    return out;
}

ExplainReport explain_report(const ExplainInputs& in) {
    RunInputs run;
    run.model_path = in.model_path;
    run.model_text = in.model_text;
    run.dtype_override = in.dtype;
    ExplainReport r{[&] {
        MetaAllocation meta;  // shapes only: no parameter is allocated
        return load_model_text(in.model_text, in.model_path, in.dtype, false);
    }()};
    r.plan = load_plan(in.plan_path);
    apply_mesh_flags(r.plan, in.mesh);
    if (!in.cluster_path.empty()) r.cluster = load_cluster(in.cluster_path);
    r.ex = explain_plan(r.model, r.plan);
    r.steps = r.plan.verify.steps > 0 ? r.plan.verify.steps : r.model.steps;
    r.memory = predict_ranks(run, r.model, r.plan, r.steps);
    if (r.cluster) {
        const DType compute = r.plan.compute_dtype(r.model.dtype);
        for (const PredictedRank& pr : r.memory)
            r.times.push_back(predict_step_time(pr.sim.step_work, by_op_dim(pr.sim.step_comm), r.plan,
                                                *r.cluster, compute));
    }

    std::vector<std::string> mesh;
    for (const auto& m : r.plan.mesh()) mesh.push_back(fmt::format("{}={}", m.name, m.size));
    r.summary.push_back(fmt::format("mesh {}", fmt::join(mesh, " x ")));
    for (std::string& line : describe_dims(r.plan)) r.summary.push_back(std::move(line));
    r.summary.push_back(fmt::format("model input {}", r.ex.resolution.input_placement.str()));

    const Plan& plan = r.plan;
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
