// Model: the module tree built from a model YAML file, with its batch, loss, optimizer and dtype.
//
//   Model m = load_model("models/mlp.yaml");
//   m.root->forward(ctx, input) ...
// Names become PyTorch FQNs; load_model validates every key, type and shape (shape inference over
// the whole tree) before anything is computed, and throws InputError at file:line:column.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/yaml_reader.h"
#include "model/blocks.h"

namespace ptool {

enum class LossKind { sum, mean, mse, cross_entropy };

// How a step's loss is normalised (the model's `loss_normalization`, a plan's overrides it;
// docs/architecture.md, The loss):
//   mean_per_call: each forward call's loss is its own mean (reduction='mean'), divided by the step's
//     microbatch count, and data parallel averages the ranks' gradients: DDP/FSDP with a mean loss and
//     naive gradient accumulation. With targets masked unevenly over ranks this is not the one-device
//     mean over the batch.
//   global_tokens: each call's loss is the sum over its valid targets divided by the step's valid-target
//     count over every data rank, context rank and microbatch (all_reduced), and data parallel sums the
//     gradients (FSDP's gradient division off): torchtitan's global_valid_tokens, transformers'
//     num_items_in_batch.
enum class LossNormalization { mean_per_call, global_tokens };
const char* loss_normalization_name(LossNormalization n);  // the YAML's spelling
// The normalisation of that name; an InputError at `where` with the names otherwise.
LossNormalization parse_loss_normalization(const std::string& name, const SourceLocation& where);
// InputError at `where` for a normalisation the loss cannot take (global_tokens of loss: sum).
void check_loss_normalization(LossNormalization n, LossKind loss, const SourceLocation& where);

// Targets masked as fine-tuning masks them (batch.masked_targets): each row's first `prompt` tokens
// and last `padding` tokens (lengths drawn per row, uniform in [lo, hi]) and, of the rest, each with
// probability `fraction`, set to the model's ignore_index. Drawn from the counter-based RNG (seed,
// "data", "target_mask"), so every run and rank masks alike.
// How parameters start (the model's `init` key): PyTorch's module defaults when absent; with it,
// transformers' _init_weights: every linear's, embedding's and position embedding's weight ~
// N(0, std) and their biases 0 (norms keep 1), a weight matching a std_by_param pattern (FQN
// patterns as plans write them) taking that pattern's std instead (GPT-2's c_proj: std / sqrt(2 n_layer)).
struct InitScheme {
    double std = 0.02;
    std::vector<std::pair<std::string, double>> std_by_param;
};

struct TargetMaskSpec {
    int64_t prompt_lo = 0, prompt_hi = 0;
    int64_t padding_lo = 0, padding_hi = 0;
    double fraction = 0;
};

// The most training steps a run takes (model `steps`, plan `verify.steps`, --steps, a golden's
// metadata): a step keeps every tensor's record, and golden keys count steps in five digits.
constexpr int64_t kMaxSteps = 100000;
// The most rounds of gradient accumulation a step takes (the model's `gradient_accumulation`, a
// plan's): each is at least one microbatch the step runs in turn.
constexpr int64_t kMaxGradientAccumulation = 65536;
const char* loss_name(LossKind k);

struct TensorSpec {
    Shape shape;
    bool ids = false;   // integer ids (tokens or class ids), else floats ~ N(0, 1)
    int64_t range = 0;  // ids are drawn from [0, range)
};

enum class OptimizerType { sgd, adamw };      // torch.optim.SGD, torch.optim.AdamW
const char* optimizer_name(OptimizerType t);  // the YAML's spelling: "sgd", "adamw"

struct OptimizerSpec {
    OptimizerType type = OptimizerType::sgd;
    double lr = 1e-3;
    double momentum = 0.0;
    double weight_decay = 0.0;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    // torch.optim.AdamW's implementation on CUDA: foreach (its default: one kernel per op over
    // every parameter, the denominators a temporary copy of the parameters) or fused (one kernel,
    // no temporaries; torchtitan's choice). The same update either way; explain's memory and time.
    bool fused = false;
};

struct Model {
    std::string name;
    std::string path;
    DType dtype = DType::float32;
    uint64_t seed = 0;
    int64_t steps = 1;
    TensorSpec input;
    std::optional<TensorSpec> target;
    LossKind loss = LossKind::sum;
    // cross_entropy's ignore_index (PyTorch's default -100): targets equal to it add nothing and are
    // not counted.
    int64_t ignore_index = -100;
    LossNormalization loss_normalization = LossNormalization::mean_per_call;
    SourceLocation loss_normalization_where;  // the key (or the model file when absent)
    std::optional<TargetMaskSpec> target_mask;
    SourceLocation target_mask_where;
    std::optional<InitScheme> init;
    OptimizerSpec optimizer;
    // gradient_accumulation: N microbatches of rows per optimizer step, each loss divided by N (under
    // a pipeline, N rounds of its schedule). The model file's: a plan's own gradient_accumulation
    // overrides it, so what a step under a plan runs is Plan::accumulation_rounds(model).
    int64_t gradient_accumulation = 1;
    // clip_grad_norm: torch.nn.utils.clip_grad_norm_(params, max_norm) before each step (0: none).
    double clip_grad_norm = 0;
    // checkpoint_format: how --init's keys read (model/checkpoint.h): pytorch (the state_dict's), hf_gpt2.
    std::string checkpoint_format = "pytorch";
    std::shared_ptr<Sequential> root;  // fqn ""
    Shape output_shape;

    // named_parameters(): registration order, each parameter once (first name, or its entry in
    // parameter_names).
    std::vector<std::pair<std::string, ParamPtr>> named_parameters() const;
    // A pipeline stage's weights tied to a module another stage holds, by the whole model's name
    // for them (train/stage.h): the stage's named_parameters() call them what the reference does.
    std::map<const Parameter*, std::string> parameter_names;
    // named_buffers(), likewise.
    std::vector<std::pair<std::string, ParamPtr>> named_buffers() const;
    // state_dict(): parameters then buffers per module, every name (tied/shared ones too).
    std::vector<std::pair<std::string, ParamPtr>> state_dict() const;
    void init_params();  // PyTorch's default init from the counter-based RNG
    // The same, leaving out the modules skip() names (a rank that builds their shards itself).
    void init_params_except(const std::function<bool(const Module&)>& skip);
    // Moves every parameter value and buffer to `device` and allocates the gradients there (uninitialised,
    // as make_param leaves them: each step zeroes them); tied parameters stay one.
    void to_device(Device device);
    // Every parameter, gradient and buffer allocated on `device` instead, uninitialised (nothing
    // copied): for a model whose values are then drawn or loaded there.
    void allocate_on(Device device);
};

// dtype_override: `--dtype` on the command line ("" keeps the file's). Without init, parameter
// storage is uninitialised until init_params / a state_dict / shard init fills it.
Model load_model(const std::string& path, const std::string& dtype_override = "");
Model load_model_text(const std::string& text, const std::string& name,
                      const std::string& dtype_override = "", bool init = true);
// The same from the file's document, parsed (load_yaml_text; the planner's variants of a model:
// plan/shrink.h ModelVariants).
Model load_model_document(const YamlNode& root, const std::string& name,
                          const std::string& dtype_override = "", bool init = true);

// Refuses models whose parameters and batch would exceed this many bytes (InputError at the key
// that crosses it), checked from the YAML before anything is allocated; every product of sizes is
// checked for overflow. Default 8 GiB, or the environment's PTOOL_MODEL_BYTE_LIMIT (bytes, or
// with K/M/G/T, or none); 0: no limit. The fuzzers set 64 MiB.
void set_model_byte_limit(int64_t bytes);

}  // namespace ptool
