// What `ptool explain MODEL PLAN [--cluster C]` reports, computed: the model on meta tensors, the
// plan's explanation (plan/explain.h), each rank class's steps simulated (memory, work,
// collectives), the step time per rank class on the cluster, and the summary lines that describe
// the plan's dims and what happens at start. The CLI prints it as text and JSON; nothing here prints.
#pragma once

#include <optional>

#include "plan/cluster.h"
#include "plan/explain.h"
#include "plan/time_model.h"
#include "train/simulate.h"

namespace ptool {

struct ExplainInputs {
    std::string model_path, model_text, dtype;  // dtype: --dtype ("" keeps the model's)
    std::string plan_path;
    std::vector<std::string> mesh;  // --mesh NAME=SIZE
    std::string cluster_path;       // "" for none
};

struct ExplainReport {
    Model model;  // on meta tensors: shapes only
    Plan plan;
    std::optional<Cluster> cluster;
    Explanation ex;
    int64_t steps = 1;                  // simulated: the plan's verify.steps, else the model's
    std::vector<PredictedRank> memory;  // per rank class
    std::vector<StepTime> times;        // per rank class, with a cluster
    // "mesh dp=2 x tp=2", "tensor parallel over 'tp' (2 ranks)", ..., "model input Replicate()"
    std::vector<std::string> summary;
    std::vector<std::string> at_start;  // the construction's collectives, one line each
    std::string data_parallel_title;    // "replicate", "fully_shard", "fully_shard over 2 dims (HSDP)"
};

ExplainReport explain_report(const ExplainInputs& in);

// One line per role of the plan's mesh ("tensor parallel over 'tp' (2 ranks)"), in the order the
// roles cut the model.
std::vector<std::string> describe_dims(const Plan& plan);

}  // namespace ptool
