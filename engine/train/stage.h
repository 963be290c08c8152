// A pipeline stage: the part of the model one pipeline rank holds and runs, as
// torch.distributed.pipelining's PipelineStage over a copy of the model with the other stages'
// layers deleted (torchtitan's pipeline_module_split). The model's **spine** is its modules in
// forward order with the containers that only chain their children opened up: the root, a repeat
// (nn.ModuleList) and a named sequential, but not a repeat's blocks nor a residual (whose forward
// adds). Split points name spine modules that start a stage (torchtitan's
// pipeline_parallel_split_points): for llama_rope, "layers.1" gives stage 0 {tok_embeddings,
// layers.0} and stage 1 {layers.1, norm, output}. A stage keeps its modules under their own FQNs
// (the state_dict names do not change) and runs them in order; the opened containers are not called
// (they report no events, and may have no hooks).
#pragma once

#include "model/model.h"
#include "parallel/plan.h"

namespace ptool {

// The model's spine, in forward order, and its members' names as their containers list them (a
// `shared` module's second use by its own name, where Module::fqn() is its first's).
std::vector<Module*> model_spine(const Model& model);
std::vector<std::string> spine_names(const Model& model);

struct StageRange {
    size_t begin = 0, end = 0;  // spine indices [begin, end)
};
// The stages' ranges: one per split point plus one. InputError at `where` for a split point that is
// no spine module's name, out of order, or that leaves a stage empty.
std::vector<StageRange> stage_ranges(const std::vector<std::string>& spine_names,
                                     const std::vector<std::string>& split_points,
                                     const SourceLocation& where);

// The stages a plan's pipeline_parallel section cuts (plan.pipeline_stages() of them): its split
// points; or layers_per_stage of the spine's blocks (a repeat's members) per stage, the first
// stage also taking the modules before the first block and the last those after the last
// (Megatron's layers per stage, the embedding on the first stage and the head on the last); or,
// given neither, the blocks evenly. InputError at the section for counts that do not fit, and for a
// module used on stages of two pp ranks (a `shared` one: each rank trains its own copy of its stages).
std::vector<StageRange> pipeline_stage_ranges(const Model& model, const std::vector<Module*>& spine,
                                              const Plan& plan);

// Removes every module outside the stages' spine ranges from the model (their parameters go with
// them, unless a kept module shares one): a pipeline rank's stage, or its virtual stages.
void keep_stages(Model& model, const std::vector<Module*>& spine, const std::vector<StageRange>& stages);

// The stage's forward and backward: its spine modules in order, and in reverse; `around` (the
// root, where it is a fully_shard unit of parameters the stage holds) has its hooks run around
// them as around its own forward and backward (no events: it is not called).
Placed stage_forward(RunContext& ctx, const std::vector<Module*>& modules, const Placed& x,
                     Module* around = nullptr);
Placed stage_backward(RunContext& ctx, const std::vector<Module*>& modules, const Placed& dy,
                      Module* around = nullptr);

}  // namespace ptool
