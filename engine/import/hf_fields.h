// A Hugging Face config's fields read as the model format writes them (the importers of
// hf_model.cpp): each refused at its field (config.json:line:column) when ptool does not model it,
// numbers formatted by ptool, names from fixed tables.
#pragma once

#include <cstdint>
#include <string>

#include "import/hf_config.h"
#include "import/hf_import.h"

namespace ptool::hf {

std::string yaml_number(double v);  // a float the YAML reads as one: 1 -> "1.0"

// The model's name: the last part of _name_or_path (Qwen/Qwen2-0.5B -> Qwen2-0.5B), else the type.
std::string model_name(const HfConfig& c, const std::string& type);

// HF's ACT2FN names that ptool computes: (gated_mlp activation, elementwise module YAML).
struct Act {
    std::string gated, module;
};
Act activation(const HfConfig& c, const std::string& key, const std::string& fallback);

// The attention's RoPE: its theta and its scaling (", rope_scaling: {...}", "" for none), from
// transformers 4's top-level `rope_theta` and `rope_scaling` or 5's `rope_parameters` (which holds
// both); the types ptool does not compute, RoPE per layer type and forms that disagree are refused
// at the field. `theta_default` is the class's; `max_positions` the config's max_position_embeddings
// (transformers 5's default of llama3's original_max_position_embeddings in rope_parameters).
struct RopeFields {
    double theta;
    std::string scaling;
};
RopeFields rope(const HfConfig& c, double theta_default, int64_t max_positions);

// A positive size, at most `max` (what any published model stays well under): the products the
// model's YAML implies then fit, and a size that would not is refused here, at its field.
int64_t size_field(const HfConfig& c, const std::string& key, int64_t fallback, int64_t max);

// An epsilon or theta: a finite number > 0 (a norm with eps <= 0 divides by zero or takes the root
// of a negative number: NaN from the first step).
double positive_field(const HfConfig& c, const std::string& key, double fallback);

double dropout_field(const HfConfig& c, const std::string& key, double fallback);  // in [0, 1)

// The attention the model gets and why: --attn, else the config's attn_implementation (or
// _attn_implementation, as some saved configs spell it), else transformers' default, sdpa.
// The config's value must be a name ptool knows (exit 2 at it); both keys set must agree.
struct AttnChoice {
    std::string impl;  // the model format's: eager or flash
    std::string why;   // for the header comment: fixed text and names from the table only
};
AttnChoice attention_choice(const HfConfig& c, const HfImportOptions& opt);

// The header's lines on the attention: which implementation, why, and what it keeps.
std::string attention_comment(const AttnChoice& a);

// The model's batch: --batch rows of --seq tokens (default min(max_positions, 2048)); InputError
// over 2^40 tokens.
struct Shape2 {
    int64_t batch, seq;
};
Shape2 batch_shape(const HfImportOptions& opt, int64_t max_positions);

}  // namespace ptool::hf
