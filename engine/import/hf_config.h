// A Hugging Face config.json, read once with positions (JSON is YAML's flow style: the strict
// YAML reader gives every refusal its file:line:column), with HF's defaults for absent fields.
// Shared by the model and the tp-plan importers (import/hf_model.cpp, import/hf_tp_plan.cpp).
#pragma once

#include <string>

#include "core/yaml_reader.h"

namespace ptool {

class HfConfig {
public:
    explicit HfConfig(const std::string& path) : root_(load_yaml_text(read_file(path, 1 << 20), path)), map_(root_, "the config") {
        if (!root_.is_map()) root_.fail("a Hugging Face config.json is a JSON object");
    }
    const YamlNode& root() const { return root_; }
    bool set(const std::string& key) {  // present and not null
        auto n = map_.get(key);
        return n && !n->is_null();
    }
    bool present(const std::string& key) { return map_.has(key); }
    YamlNode at(const std::string& key) { return map_.at(key); }
    int64_t pos(const std::string& key, int64_t fallback) {
        return set(key) ? map_.at(key).as_positive_int(fmt::format("'{}'", key)) : fallback;
    }
    double num(const std::string& key, double fallback) { return set(key) ? map_.at(key).as_double(fmt::format("'{}'", key)) : fallback; }
    bool flag(const std::string& key, bool fallback) { return set(key) ? map_.at(key).as_bool(fmt::format("'{}'", key)) : fallback; }
    std::string str(const std::string& key, const std::string& fallback) {
        return set(key) ? map_.at(key).as_string(fmt::format("'{}'", key)) : fallback;
    }
    // Fails at the key when it is present (and not null, false or 0): a feature ptool does not model.
    void refuse_if_set(const std::string& key, const std::string& why) {
        if (!set(key)) return;
        const YamlNode n = map_.at(key);
        if (n.is_scalar() && (n.raw().Scalar() == "false" || n.raw().Scalar() == "0")) return;
        n.fail(fmt::format("'{}' is set: {}", key, why));
    }

private:
    YamlNode root_;
    YamlMap map_;
};

// The config's model_type when ptool imports it; else exit 2 at the field.
std::string hf_model_type(HfConfig& c);
// tie_word_embeddings, with the config class's default (PretrainedConfig's true for GPT-2; Llama,
// Mistral and Qwen2's own classes say false).
bool hf_tied_head(HfConfig& c, const std::string& type);

}  // namespace ptool
