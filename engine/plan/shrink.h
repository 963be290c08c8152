// A proxy of a model for a plan (`ptool shrink`, `ptool plan --verify`): the same module tree and
// names, at most 2 blocks per repeat, and sizes small enough to verify on this machine that still
// split as the plan splits them, so the plan's semantics (styles, sequence parallelism,
// fully_shard, checkpointing, mixed precision, loss_parallel) are checked before a cluster is used.
//
//   attention: kv_heads' = tp when tp divides kv_heads (else kept), heads' keeping the group size,
//              head dim 8; its dim' = heads' x 8 (the lcm when several attentions share a dim)
//   every other size (the keys each module type lists, model/module_type.h: dim, hidden, in, out,
//              vocab, features): the k-th distinct value, smallest
//              first, becomes lcm(tp, 8) x k, so equal sizes stay equal and every size divides by tp
//   batch: rows = dp x gradient_accumulation x 2 (the plan's gradient_accumulation over the model's,
//              which the proxy then says too); tokens' sequence (or a float input's middle dims)
//              2 x tp, the sequence (dim 1) times cp's chunks under context parallel (cp, or 2 x cp
//              load-balanced); the last dim of a float input as the sizes above
// A pipeline plan's proxy keeps one block per stage (at least 2) and rows for the plan's
// microbatches, 2 rows each per data rank; its stages are then cut one block each (layers_per_stage
// 1: ptool plan --verify rewrites the plan so), the stage count and schedule kept.
// Numbers change, structure and divisibility do not: a proxy that passes says the plan computes
// what the single-device model computes, not that the real model fits (ptool plan's memory says).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/yaml_reader.h"
#include "parallel/plan.h"

namespace ptool {

// The planner's variants of a model: its document, parsed once, with every repeat of 4 or more
// blocks at `count` blocks (0: as written), gradient_accumulation `microbatches` and, given rows > 0,
// a batch of `rows` rows (the input's, or its tokens', first dim and the target's), each set in place
// for the model loader to build (load_model_document). A planner builds hundreds of variants of one
// model: their text emitted and parsed again each was a tenth of its time.
class ModelVariants {
public:
    ModelVariants(const std::string& text, const std::string& name);  // text: a model the loader accepted
    ModelVariants(const ModelVariants&) = delete;
    ModelVariants& operator=(const ModelVariants&) = delete;
    // The document as this variant: the one document, valid as such until the next call.
    const YamlNode& at(int64_t count, int64_t microbatches, int64_t rows = 0);

private:
    YamlNode doc_;
    // the repeats' counts and the batch's first dims, each with its text as written; a count's
    // value as the loader reads it (012 is 12) says whether a variant sets it (4 or more blocks)
    struct Count {
        YAML::Node node;
        std::string text;
        bool long_repeat;
    };
    std::vector<Count> counts_;
    std::vector<std::pair<YAML::Node, std::string>> rows_;
};

// The proxy's YAML text. `model_text` must load (the model loader's errors are the caller's).
std::string shrink_model(const std::string& model_text, const std::string& name, const Plan& plan);

}  // namespace ptool
