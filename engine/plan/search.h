// ptool plan: the search over how to run a model on a cluster. Candidates are dp x tp meshes
// (tp within a node), fully_shard or replicate over dp or, where dp spans nodes, HSDP (fully_shard
// over a node's dp ranks, replicated across nodes), activation checkpointing of the repeated
// blocks or not, and the model's gradient_accumulation doubled until the batch fits (microbatches), torchao's
// float8 where asked (SearchOptions::float8: with or without it, or both); plans are
// written by plan/plan_writer.h. Each is linted (explain's rules: heads, kv heads, features, vocab and
// sequence must divide by tp, rows by dp x microbatches; a mesh under which explain expects a mismatch, such
// as loss: sum averaged by DDP, is refused with that cause) and simulated on meta tensors (train/simulate.h)
// for kSteadyStateSteps (3: the optimizer's state exists from the second, the allocator's segments are steady
// from the third), rank 0 only: the lint refuses uneven shards, so every rank holds the same sizes. A model
// with one repeat of L >= 4 blocks is simulated with 4 and 5 blocks and its work, collectives and each
// phase's peak (module pass, blocks named first and last) extrapolated linearly to L, the largest phase
// giving the peak (checked against full simulations in tests/plan_cases.py). Fitting candidates (what
// PyTorch's caching allocator reserves for the peak, plus fully_shard's prefetch of the next unit, within the
// GPU's memory less the plan's runtime: plan/device_overheads.h) are ranked by the time model
// (plan/time_model.h). Pipelines (pp x dp x tp, 1F1B and interleaved 1F1B) join where fewer dp x tp plans fit
// than listed, or when asked: their stages are sampled and balanced as plan/pipeline_search.h says, their
// step the schedule's critical path. docs/planning.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/float8_linear.h"
#include "plan/cluster.h"
#include "plan/plan_writer.h"
#include "plan/rejection.h"
#include "plan/time_model.h"

namespace ptool {

// What the search does with torchao's float8 linears (ptool plan --float8): none; every candidate
// with the recipe; each candidate without and with tensorwise, both ranked.
enum class Float8Search { never, tensorwise, rowwise, offer };
const char* float8_search_name(Float8Search s);  // "never", "tensorwise", "rowwise", "offer"
std::vector<std::string> float8_search_names();  // every one, in the enum's order
std::optional<Float8Search> float8_search_named(const std::string& name);  // none: not a name of one

struct SearchOptions {
    int world_size = 0;  // 0: the cluster's
    // bytes per GPU for tensors; 0: the cluster's memory less its reserve and each plan's runtime
    // (plan/device_overheads.h)
    double memory_cap = 0;
    std::optional<std::string> param_dtype =
        "bfloat16";  // mixed precision; nullopt: compute in the model's dtype
    int max_microbatches = 16;
    // Pipelines are simulated where they could rank among this many fastest plans (ptool plan's
    // --top; 0: every pipeline)
    int keep = 5;
    // auto: pipelines are searched when fewer than `keep` dp x tp plans fit (a pipeline adds a
    // bubble and stages to balance: proposed where the model needs it, as Megatron's guidance
    // reaches for pp once tp fills a node); always; never
    std::string pipelines = "auto";
    unsigned threads = 0;  // 0: one per core
    // torchao's float8 linears (docs/float8.md), each float8 candidate with torch.compile. Other than
    // never on a cluster without float8 tensor cores: InputError.
    Float8Search float8 = Float8Search::never;
};

struct Candidate {
    PlanChoice choice;
    int microbatches = 1;        // gradient_accumulation
    int model_microbatches = 1;  // the model file's
    std::string plan_text;
    double peak = 0;  // bytes per rank: PyTorch's allocated peak (its cuBLAS workspaces included)
    // what PyTorch's caching allocator reserves for them (core/allocator_model.h); what must fit. A
    // listed candidate's (whole): explain's, from the whole model; the others': the peak plus the
    // largest excess of reserved over peak in the simulated samples
    double reserved = 0;
    double runtime =
        0;  // the runtime's memory outside the allocator on its neediest rank (0 under --memory-cap)
    StepTime time;
    double mfu = 0;
    bool extrapolated = false;
    // its memory from the whole model, as explain simulates it (the listed candidates: the others
    // keep the samples')
    bool whole = false;
};

struct SearchResult {
    std::string pipelines_skipped;   // why pipelines were not searched ("" when they were)
    std::vector<Candidate> fitting;  // fastest first
    std::vector<Rejection> rejected;
    int evaluated = 0;           // candidates simulated
    std::string tp_unsupported;  // why tp > 1 was not tried ("" when it was)
    double memory_cap = 0;
    int world_size = 0;
    DType compute = DType::float32;
    Float8Search float8 = Float8Search::never;  // SearchOptions::float8
};

// model_text: the model file's text (already loadable); name for messages.
SearchResult search_plans(const std::string& model_text, const std::string& name, const Cluster& cluster,
                          const SearchOptions& o);

}  // namespace ptool
