// Plan YAML: the mesh, parallelize_module's plan for the tensor-parallel dim, and what verify
// compares. Strict like the model YAML: every error is an InputError at file:line:column.
//
//   mesh: {dp: 2, tp: 4}     # named dims; each section names the dims it uses (parallel/parallel_dims.h)
//   tensor_parallel:
//     mesh_dim: tp
//     src_data_rank: 0        # rank whose full weights are split and sent; null = no communication
//     loss_parallel: false    # cross_entropy on the vocabulary-sharded output (no gather)
//     plan:
//       "layers.*.net1": colwise
//       "layers.*.net2": {style: rowwise, output_layouts: shard(0)}
//   data_parallel:
//     mesh_dim: dp             # or [dp_replicate, dp_shard]: HSDP (fully_shard over a 2-D mesh)
//     mode: replicate          # replicate (DDP) | fully_shard (FSDP2: the root is a unit)
//     modules: [""]            # replicate() these modules, each its own DDP with its own buckets
//     fully_shard: [linears.*] # fully_shard() units (patterns), in either mode
//     bucket_cap_mb: 25
//     gradient_as_bucket_view: false
//     ignored_modules: [fc1]
//     broadcast_buffers: true
//     sync_batch_norm: false
//     zero_stage: 0            # mode replicate: 1 shards the optimizer state, 2 also the gradients
//     mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}
//   pipeline_parallel:
//     mesh_dim: pp             # one stage per rank (interleaved_1f1b: virtual_stages per rank)
//     split_points: [layers.2] # modules that start stages 1.. (or layers_per_stage: N)
//     schedule: 1f1b           # gpipe | 1f1b | interleaved_1f1b
//     microbatches: 4          # per round of gradient accumulation; default: the stages
//   context_parallel:
//     mesh_dim: cp             # the sequence split over its ranks for the whole model
//     rotate_method: allgather # how attention sees every key and value: allgather | alltoall (the ring)
//     load_balance: true       # 2 x cp chunks, rank i holding chunks i and 2cp-1-i (torch's default)
//   expert_parallel:
//     mesh_dim: dp             # a data dim the experts split over (parallel/expert_parallel.h)
//   gradient_accumulation: 4   # the step's rounds, over the model's (the training layout ptool plan chose)
//   verify: {steps: 2, compare: [output, loss, grad, param], tolerance: {rtol: 1.3e-6, atol: 1e-5}}
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fqn_pattern.h"
#include "core/tolerance.h"
#include "model/context_shard.h"
#include "parallel/activation_checkpointing.h"
#include "parallel/device_mesh.h"
#include "parallel/float8_training.h"
#include "parallel/parallel_dims.h"
#include "parallel/style.h"

namespace ptool {

struct PlanEntry {
    std::string pattern;  // FQN pattern, fnmatch per dotted atom; "" is the root module
    StyleSpec style;
    SourceLocation where;  // the pattern's key
};

// Mixed precision (FSDP2's MixedPrecisionPolicy; DDP's _MixedPrecision): the model's parameters
// stay in its dtype (the optimizer's masters); forward and backward compute with copies in
// param_dtype; gradients are reduced across dp ranks in reduce_dtype (default: param_dtype).
// Written under data_parallel, as PyTorch configures it; the single-device reference computes
// with the same policy (parallel/mixed_precision.h).
struct MixedPrecisionSpec {
    DType param_dtype = DType::float32;
    DType reduce_dtype = DType::float32;
    bool cast_forward_inputs = true;
    SourceLocation where;
};

// How data_parallel synchronises parameters: replicate() (DDP: every rank holds them whole) or
// fully_shard() (FSDP2: the root is a unit; each rank holds its rows).
enum class DataParallelMode { replicate, fully_shard };
const char* data_parallel_mode_name(DataParallelMode m);  // "replicate", "fully_shard"

// data_parallel: DDP's replicate() and FSDP2's fully_shard() on one mesh dim, or HSDP: fully_shard
// over two (replicated over the first, sharded over the second, as fully_shard on a 2-D mesh).
struct DataParallelSpec {
    std::vector<std::string> mesh_dims;  // one, or [replicate, shard] (HSDP)
    DataParallelMode mode = DataParallelMode::replicate;
    std::vector<std::string> modules = {""};  // replicate() roots (exact FQNs)
    std::vector<std::string> fully_shard;     // fully_shard() units: FQN patterns
    double bucket_cap_mb = 25;
    bool gradient_as_bucket_view = false;
    std::vector<std::string> ignored_modules;  // exact FQNs
    bool broadcast_buffers = true;
    bool sync_batch_norm = false;
    // ZeRO under replicate() (parallel/zero_optimizer.h): 0 plain DDP; 1 the optimizer state
    // sharded over the dp ranks (DeepSpeed ZeRO-1, Megatron's distributed optimizer); 2 the
    // gradients too (ZeRO-2: reduce_scatter in place of the all_reduce).
    int zero_stage = 0;
    SourceLocation where, modules_where, fully_shard_where, ignored_where, zero_stage_where;

    bool hybrid() const { return mesh_dims.size() == 2; }  // HSDP
    std::string mesh_dim_names() const;                    // "dp", or "dp_replicate x dp_shard"
};

// The order a pipeline runs its microbatches in (train/schedule.h): accumulation is one stage's
// F0 B0 F1 B1 ...; gpipe every forward, then every backward; 1f1b torch's Schedule1F1B;
// interleaved_1f1b torch's ScheduleInterleaved1F1B (Megatron's virtual pipeline stages).
enum class ScheduleKind {
    accumulation,
    gpipe,
    one_f_one_b,
    interleaved_one_f_one_b,
    zero_bubble,
    zbv,
    dualpipev
};
// "accumulation", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "dualpipev"
const char* schedule_kind_name(ScheduleKind k);
// The schedules that split each backward into I and W (docs/zero_bubble.md).
bool splits_backward(ScheduleKind k);
// Two stages per rank in a V (stages s and 2 pp - 1 - s on rank s: zbv, dualpipev), not the loop.
bool v_placed(ScheduleKind k);

// pipeline_parallel: the model's layers in stages, one per rank of the pp dim (virtual_stages
// per rank under interleaved_1f1b, stage s on rank s mod pp), as torch.distributed.pipelining runs
// them (train/stage.h, train/schedule.h). A step runs accumulation_rounds() rounds of the schedule
// (the plan's gradient_accumulation, else the model's), each over `microbatches` microbatches; every
// microbatch's loss is divided by the step's microbatch count before its backward
// (docs/plan_format.md).
struct PipelineSpec {
    // spine modules that start stages 1.. (torchtitan's pipeline_parallel_split_points); empty when
    // layers_per_stage cut them
    std::vector<std::string> split_points;
    int layers_per_stage = 0;  // the spine's blocks per stage (the first also takes what comes
                               // before the blocks, the last what comes after); 0: split_points
    ScheduleKind schedule = ScheduleKind::one_f_one_b;
    int virtual_stages = 1;  // stages per pp rank (interleaved_1f1b: 2 or more)
    int microbatches = 0;    // per round; 0: one per stage (the fewest the schedules take)
    // Megatron's scatter_gather_tensors_in_pipeline: an activation or gradient whole on every rank
    // of the tp dim goes between stages as each tp rank's 1/tp of its elements, all_gathered over tp
    // after the receive (train/run_stage.cpp). false (torch's pipelining): each rank sends it whole.
    bool scatter_gather = false;
    SourceLocation where, split_where, microbatches_where, scatter_gather_where, schedule_where;
};

// context_parallel: the batch's sequence split over the ranks of its dim for the whole model, as
// torch's context_parallel() and torchtitan's cp run it (model/context_shard.h). Every parameter is
// replicated over cp and its gradient averaged over cp (summed for a sum loss) after backward.
struct ContextParallelSpec {
    RotateMethod rotate = RotateMethod::allgather;
    bool load_balance = true;
    SourceLocation where, rotate_where;
};

// expert_parallel: every moe layer's experts split over the ranks of a data dim, which the section
// borrows (torchtitan's ep, borrowed from dp_shard x cp): each rank keeps experts/ep of them and
// routes its own tokens to their owners and back by all_to_all (parallel/expert_parallel.h).
struct ExpertParallelSpec {
    SourceLocation where;
};

struct VerifySpec {
    int64_t steps = 0;  // 0: the model's
    std::vector<std::string> compare = {"output", "loss", "grad", "param"};
    Tolerance::Override tolerance;
};

struct Plan {
    std::string path, yaml_text, name;
    // The mesh and the role each section gave its dims (tensor_parallel: tp; data_parallel:
    // dp_replicate or dp_shard, both for HSDP): every parallel dimension is asked for by role.
    ParallelDims dims;
    SourceLocation mesh_where;
    // tensor_parallel (present when dims has a tp dim)
    std::optional<int> src_data_rank = 0;  // nullopt: each rank builds its own shard
    SourceLocation src_data_rank_where;
    std::vector<PlanEntry> tp_plan;
    SourceLocation tp_plan_where;
    // cross_entropy on the vocabulary-sharded output, no gather (parallel/loss_parallel.h)
    bool loss_parallel = false;
    SourceLocation loss_parallel_where;
    std::optional<DataParallelSpec> data_parallel;
    std::optional<MixedPrecisionSpec> mixed_precision;    // data_parallel.mixed_precision
    std::optional<PipelineSpec> pipeline;                 // its dim is the pp role's
    std::optional<ContextParallelSpec> context_parallel;  // its dim is the cp role's
    std::optional<ExpertParallelSpec> expert_parallel;    // its dim is a data dim, borrowed (dims' ep)
    std::optional<Float8Spec> float8;  // torchao's float8 linears (parallel/float8_training.h)
    // torch.compile on the model (torchtitan's compile.enable): what explain prices of it is its
    // fusion of torchao's float8 casts (model/float8_cost.h); verify runs the same numbers.
    bool compile = false;
    // Microbatches per round of gradient accumulation when there is no pipeline (the reference of a
    // pipeline plan computes its microbatches: reference_plan)
    int round_microbatches = 1;
    // gradient_accumulation: the step's rounds of gradient accumulation, over the model's key of the
    // same name and meaning (0: the model's). The training layout a plan was chosen with travels in
    // it (ptool plan writes it); read it through accumulation_rounds.
    int64_t gradient_accumulation = 0;
    SourceLocation gradient_accumulation_where;
    // loss_normalization: over the model's key of the same name and meaning (model/model.h); read
    // it through normalization(model).
    std::optional<LossNormalization> loss_normalization;
    SourceLocation loss_normalization_where;
    // activation_checkpointing: which modules recompute what in backward (full, op-level
    // selective, Megatron's core attention; parallel/activation_checkpointing.h)
    ActivationCheckpointingSpec activation_checkpointing;
    VerifySpec verify;

    const std::vector<MeshDim>& mesh() const { return dims.mesh(); }
    int world_size() const { return dims.world_size(); }
    // What forward and backward compute in: mixed_precision's param_dtype, else the model's dtype.
    DType compute_dtype(DType model_dtype) const {
        return mixed_precision ? mixed_precision->param_dtype : model_dtype;
    }
    int dim_size(const std::string& name) const;  // 1 for a dim the mesh lacks
    // The pipeline's stages (pp ranks x virtual stages; 1 without a pipeline) and how many
    // microbatches each round of gradient accumulation runs (the pipeline's, else round_microbatches)
    int pipeline_stages() const;
    int microbatches_per_round() const;
    // The rounds of gradient accumulation a step of `model` runs under this plan: the plan's
    // gradient_accumulation, else the model's. Every reader of a step's microbatching asks here
    // (a step runs accumulation_rounds(model) x microbatches_per_round() microbatches), so no
    // command can see another count than another.
    int64_t accumulation_rounds(const Model& model) const {
        return gradient_accumulation > 0 ? gradient_accumulation : model.gradient_accumulation;
    }
    // The step's loss normalisation under this plan: the plan's loss_normalization, else the model's;
    // and where it was said.
    LossNormalization normalization(const Model& model) const {
        return loss_normalization.value_or(model.loss_normalization);
    }
    const SourceLocation& normalization_where(const Model& model) const {
        return loss_normalization ? loss_normalization_where : model.loss_normalization_where;
    }
    // How data parallel combines the ranks' gradients: summed under global_tokens (each loss is
    // already divided by the step's count over every rank: FSDP's gradient division off), else
    // averaged (PyTorch's default).
    ReduceOp gradient_reduction(const Model& model) const {
        return normalization(model) == LossNormalization::global_tokens ? ReduceOp::sum : ReduceOp::avg;
    }
    bool compares(const std::string& what) const;
    // `--mesh NAME=SIZE`: resizes a dim and checks the plan again (src_data_rank must stay a rank
    // of the tensor-parallel dim). InputError naming the flag otherwise.
    void resize_mesh(const std::string& name, int size, const std::string& flag);
};

Plan load_plan(const std::string& path);
// `--mesh NAME=SIZE` flags (verify, explain), each resizing a dim of the plan; InputError naming
// the flag when it does not read NAME=SIZE with 1 <= SIZE <= 4096, or the plan refuses it.
void apply_mesh_flags(Plan& plan, const std::vector<std::string>& flags);
Plan load_plan_text(const std::string& text, const std::string& path);
// A plan ptool wrote itself (plan/plan_writer.h's write_plan, read back by the planner): the same
// reading, without the checks that guard against a hostile file (core/yaml_reader.h load_emitted_yaml).
Plan load_emitted_plan(const std::string& text, const std::string& path);

// InputError unless the pipeline's split points make plan.pipeline_stages() stages and its
// microbatches fit its schedule (checked on load, after --mesh, and by a Run given a built plan).
void check_pipeline_counts(const Plan& plan);

// InputError unless the step's microbatches (accumulation_rounds x microbatches_per_round) cut the
// model's batch into equal rows that split over the data ranks: at the plan's gradient_accumulation
// where the plan sets it (and, with a pipeline, its microbatches alone would fit), else at the
// pipeline's microbatches (resolve_plan checks it first; shrink against the real model).
void check_microbatches(const Plan& plan, const Model& model);

}  // namespace ptool
