// Hugging Face configs into ptool's files (docs/hf_import.md).
//
// import_hf_model: a `config.json` of the llama, mistral, qwen2, qwen3, olmo2, gpt2 families or the
// mixtures of experts mixtral, qwen2_moe and qwen3_moe becomes a model
// YAML whose parameters carry HF's FQNs (model.layers.0.self_attn.q_proj.weight, lm_head.weight;
// transformer.h.0.ln_1.weight for GPT-2), so `--init` takes the model's safetensors checkpoint and
// the parameter count is HF's. The attention is `attn_implementation: flash` (no [B*H, T, T] scores
// kept), as transformers' default, SDPA, keeps it, unless --attn or the config's attn_implementation
// says eager (the flag wins over the config, the config over the default). Fields that change the
// computation and that ptool does not model (sliding windows, dense layers among MoE ones, a
// rope_scaling or rope_parameters other than linear and llama3, RoPE per layer type, a head_dim
// other than hidden/heads but Qwen3's) are exit 2 at the field; an absent field is the config
// class's default (hf_model.cpp's decoder_families()).
// The config is strict JSON with typed fields (import/hf_config.h); what it says reaches the YAML
// only as numbers, table entries or emitter-quoted strings (core/yaml_writer.h).
//
// import_hf_tp_plan: the family's transformers `base_model_tp_plan` (or the config's own) and the
// causal-LM head's `_tp_plan`, as a plan YAML; an entry ptool has no style for is exit 2 with why.
#pragma once

#include <string>
#include <vector>

namespace ptool {

struct HfImportOptions {
    int64_t batch = 1;  // rows of the model's batch
    int64_t seq = 0;    // tokens per row; 0: min(max_position_embeddings, 2048)
    int tp = 2;         // the plan's mesh size (hf-tp-plan)
    // --attn: one of hf_attn_names(); "" takes the config's attn_implementation (or
    // _attn_implementation), else transformers' default, sdpa (the model's `flash`)
    std::string attn;
};

// The attention implementations the import takes (--attn, a config's attn_implementation):
// transformers' names (eager, sdpa, flash_attention_2, flash_attention_3, flex_attention) and the
// model format's (eager, flash); each is written as the model format's `eager` or `flash`.
std::vector<std::string> hf_attn_names();

struct HfImport {
    std::string yaml;  // the file's text
    std::vector<std::string>
        warnings;  // what the config says that ptool does not model, e.g. attention dropout
};

HfImport import_hf_model(const std::string& config_path, const HfImportOptions& opt);
HfImport import_hf_tp_plan(const std::string& config_path, const HfImportOptions& opt);
// The same from the config's text (`name` for the messages): the fuzzers' entry.
HfImport import_hf_model_text(const std::string& text, const std::string& name, const HfImportOptions& opt);
HfImport import_hf_tp_plan_text(const std::string& text, const std::string& name, const HfImportOptions& opt);

}  // namespace ptool
