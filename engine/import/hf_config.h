// A Hugging Face config.json, read once as strict JSON with positions (core/json_reader.h: a
// single quote, a trailing comma, a leading zero, a YAML config are refused at their place), each
// field typed as transformers' config class types it (an integer is a JSON integer, a flag true or
// false, a string a string: "false" is not false, "32" is not 32), with HF's defaults for absent
// fields. Every refusal is at config.json:line:column. Shared by the model and the tp-plan
// importers (import/hf_model.cpp, import/hf_tp_plan.cpp).
#pragma once

#include <string>

#include "core/json_reader.h"

namespace ptool {

class HfConfig {
public:
    HfConfig(const std::string& text, const std::string& name) : root_(load_json_text(text, name)) {
        if (!root_.is_object())
            root_.fail(fmt::format("a Hugging Face config.json is a JSON object, got {}", root_.type_name()));
    }
    const JsonNode& root() const { return root_; }
    bool set(const std::string& key) const {  // present and not null
        auto n = root_.get(key);
        return n && !n->is_null();
    }
    bool present(const std::string& key) const { return root_.get(key).has_value(); }
    JsonNode at(const std::string& key) const { return root_.at(key); }
    // A typed field, or `fallback` where it is absent (or null where transformers reads None as
    // "unset": nullable()); a null elsewhere is exit 2 at it (transformers keeps the None, and the
    // model cannot be built: hidden_size null was imported with Llama's 4096).
    int64_t pos(const std::string& key, int64_t fallback) const {
        return given(key) ? at(key).as_positive_int(fmt::format("'{}'", key)) : fallback;
    }
    double num(const std::string& key, double fallback) const {
        return given(key) ? at(key).as_number(fmt::format("'{}'", key)) : fallback;
    }
    // a null flag is Python's None, which reads as false where transformers tests it
    // (`if config.tie_word_embeddings:`, `bias=config.attention_bias`)
    bool flag(const std::string& key, bool fallback) const {
        if (auto n = root_.get(key); n && n->is_null()) return false;
        return given(key) ? at(key).as_bool(fmt::format("'{}'", key)) : fallback;
    }
    std::string str(const std::string& key, const std::string& fallback) const {
        return given(key) ? at(key).as_string(fmt::format("'{}'", key)) : fallback;
    }
    bool null(const std::string& key) const {  // present and null
        auto n = root_.get(key);
        return n && n->is_null();
    }
    // the fields every config class that has them resolves when None: sliding_window, rope_scaling
    // and rope_parameters (none), GPT-2's n_inner (4 x n_embd: GPT2MLP), the token ids, the dtype,
    // the name, a router's jitter (none). num_key_value_heads and head_dim are resolved by some
    // classes only: the family's table says (import/hf_model.cpp).
    static bool nullable(const std::string& key) {
        for (const char* k : {"sliding_window", "rope_scaling", "rope_parameters", "n_inner",
                              "max_window_layers", "pad_token_id", "bos_token_id", "eos_token_id",
                              "torch_dtype", "dtype", "_name_or_path", "router_jitter_noise"})
            if (key == k) return true;
        return false;
    }
    // Fails at the key's value, or at the object when the key is absent (its default is what fails).
    [[noreturn]] void fail_at(const std::string& key, const std::string& message) const {
        if (auto n = root_.get(key)) n->fail(message);
        root_.fail(fmt::format("{} ('{}' is absent: the config class's default)", message, key));
    }
    // Fails at the key when it is present and not null, false or 0: a feature ptool does not model.
    void refuse_if_set(const std::string& key, const std::string& why) const {
        if (!set(key)) return;
        const JsonNode n = at(key);
        if ((n.value().is_boolean() && !n.value().get<bool>()) ||
            (n.value().is_number() && n.value().get<double>() == 0))
            return;
        n.fail(fmt::format("'{}' is set: {}", key, why));
    }

private:
    bool given(const std::string& key) const {
        auto n = root_.get(key);
        if (n && n->is_null() && !nullable(key))
            n->fail(
                fmt::format("'{}' is null: transformers keeps None there and cannot build the model; give "
                            "a value, or drop the key for the config class's default",
                            key));
        return n && !n->is_null();
    }
    JsonNode root_;
};

// The config's model_type when ptool imports it; else exit 2 at the field.
std::string hf_model_type(const HfConfig& c);
// tie_word_embeddings, with the config class's default (the family table's in hf_model.cpp:
// PretrainedConfig's true for GPT-2, false in every decoder family's own class).
bool hf_tied_head(const HfConfig& c, const std::string& type);

}  // namespace ptool
