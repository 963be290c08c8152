// `ptool import hf-tp-plan CONFIG.json`: transformers' tensor-parallel plan for a model (the
// config's "base_model_tp_plan", else its config class's, under the base model's prefix, plus the
// causal-LM head's `_tp_plan`) as a plan YAML. Each transformers style maps to ptool's or is
// refused with the reason (docs/hf_import.md has the table).
#include <algorithm>
#include <map>
#include <optional>

#include "core/files.h"
#include "core/yaml_writer.h"
#include "import/hf_config.h"
#include "import/hf_import.h"
#include "parallel/style_names.h"

namespace ptool {

namespace {

// transformers' ParallelInterface names (its vocabulary, the keys) -> ptool plan entries ("" with
// the reason: refused).
struct StyleMap {
    std::string entry, why;
};
const std::map<std::string, StyleMap>& styles() {
    using namespace style_name;
    static const std::map<std::string, StyleMap> m = {
        {"colwise", {entry(colwise), ""}},
        {"rowwise", {entry(rowwise), ""}},
        {"colwise_rep", {entry(colwise, "output_layouts: replicate"), ""}},
        {"rowwise_rep", {entry(rowwise, "input_layouts: replicate"), ""}},
        // transformers' local_* run the same sharding on plain tensors instead of DTensors; ptool
        // always hands local tensors between modules, so they are the same style here
        {"local_colwise", {entry(colwise), ""}},
        {"local_rowwise", {entry(rowwise), ""}},
        {"sequence_parallel", {entry(sequence_parallel), ""}},
        {"replicate", {entry(replicate), ""}},
        {"gather",
         {"", "GatherParallel gathers a module's output for expert routing; ptool has no such style"}},
        {"local", {"", "IsolatedParallel keeps a module rank-local (MoE experts); ptool has no such style"}},
        {"local_packed_rowwise", {"", "packed (fused gate_up) weights are not modelled"}},
        {"packed_colwise", {"", "packed (fused gate_up) weights are not modelled"}},
        {"packed_rowwise", {"", "packed (fused gate_up) weights are not modelled"}},
        {"ep_router", {"", "expert parallelism is not modelled"}},
        {"grouped_gemm", {"", "grouped-GEMM experts are not modelled"}},
    };
    return m;
}

// The config classes' plans (transformers' LlamaConfig, MistralConfig and Qwen2Config agree), in
// transformers' names.
const std::vector<std::pair<std::string, std::string>> kDecoderPlan = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.mlp.gate_proj", "colwise"},    {"layers.*.mlp.up_proj", "colwise"},
    {"layers.*.mlp.down_proj", "rowwise"},
};

// transformers' MixtralConfig.base_model_tp_plan: the router colwise_rep ("we need to replicate
// here to correctly route experts"), each expert's w1 and w3 colwise, w2 rowwise: Megatron's TP
// inside the experts, without expert parallelism.
const std::vector<std::pair<std::string, std::string>> kMixtralPlan = {
    {"layers.*.self_attn.q_proj", "colwise"},
    {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"},
    {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.block_sparse_moe.gate", "colwise_rep"},
    {"layers.*.block_sparse_moe.experts.*.w1", "colwise"},
    {"layers.*.block_sparse_moe.experts.*.w2", "rowwise"},
    {"layers.*.block_sparse_moe.experts.*.w3", "colwise"},
};

// A transformers module pattern in the imported model's names: Mixtral's experts are gated MLPs
// named gate_proj, up_proj, down_proj here (w1, w3, w2 in transformers: the same products,
// docs/hf_import.md).
std::string imported_pattern(const std::string& type, const std::string& pattern) {
    if (type != "mixtral") return pattern;
    static const std::vector<std::pair<std::string, std::string>> names = {
        {".w1", ".gate_proj"}, {".w3", ".up_proj"}, {".w2", ".down_proj"}};
    for (const auto& [hf, own] : names)
        if (pattern.size() > hf.size() && pattern.compare(pattern.size() - hf.size(), hf.size(), hf) == 0)
            return pattern.substr(0, pattern.size() - hf.size()) + own;
    return pattern;
}

}  // namespace

HfImport import_hf_tp_plan_text(const std::string& text, const std::string& name,
                                const HfImportOptions& opt) {
    if (opt.tp < 1) throw InputError(fmt::format("--tp {}: must be at least 1", opt.tp));
    const HfConfig c(text, name);
    const std::string type = hf_model_type(c);
    const std::string prefix = type == "gpt2" ? "transformer." : "model.";  // the base model's attribute
    const JsonNode& root = c.root();
    struct Entry {
        std::string pattern, style;
        std::optional<JsonNode> at;  // where the config says it
    };
    std::vector<Entry> entries;
    std::string source;
    if (c.set("base_model_tp_plan")) {
        const JsonNode plan = c.at("base_model_tp_plan");
        for (const auto& [pattern, v] : plan.members("'base_model_tp_plan' (module pattern: style)"))
            entries.push_back({pattern, v.as_string("a tp plan style"), v});
        source = "the config's base_model_tp_plan";
    } else if (type == "gpt2") {
        c.fail_at(
            "model_type",
            "GPT-2 has no base_model_tp_plan in transformers (and its fused Conv1D c_attn splits q, k and "
            "v across ranks wrongly under colwise); write the plan by hand");
    } else if (type == "mixtral") {
        for (const auto& [p, s] : kMixtralPlan) entries.push_back({p, s, std::nullopt});
        source = "transformers' mixtral base_model_tp_plan";
    } else if (type != "llama" && type != "mistral" && type != "qwen2") {
        c.fail_at(
            "model_type",
            fmt::format("transformers' {} base_model_tp_plan has styles ptool does not model (q_norm and "
                        "k_norm replicated with a gradient all_reduce; the experts' packed, grouped and "
                        "expert-parallel styles); write the plan by hand",
                        type));
    } else {
        for (const auto& [p, s] : kDecoderPlan) entries.push_back({p, s, std::nullopt});
        source = fmt::format("transformers' {} base_model_tp_plan", type);
    }
    HfImport out;
    std::string& y = out.yaml;
    y += fmt::format(
        "# Tensor parallelism for {} from {}: {} under the base model's prefix '{}', and\n"
        "# the causal-LM head's _tp_plan (lm_head: colwise_rep). `ptool import hf-tp-plan`.\n",
        type, yaml_comment(root.file()), source, prefix);
    y += fmt::format("mesh: {{tp: {}}}\ntensor_parallel:\n  plan:\n", opt.tp);
    for (const Entry& e : entries) {
        auto it = styles().find(e.style);
        if (it == styles().end() || it->second.entry.empty()) {
            const std::string why =
                it == styles().end()
                    ? fmt::format("{} is not a transformers tp style ptool knows", yaml_quoted(e.style))
                    : it->second.why;
            const std::string msg =
                fmt::format("tp plan entry {}: {}: {}", yaml_quoted(e.pattern), yaml_quoted(e.style), why);
            if (e.at) e.at->fail(msg);
            throw InputError(msg);
        }
        y += fmt::format("    {}: {}\n", yaml_quoted(prefix + imported_pattern(type, e.pattern)),
                         it->second.entry);  // the key as the config spells it (the model's names), quoted
    }
    // a tied head's weight is the embedding's: one parameter has one placement, so the embedding is
    // sharded over the vocabulary with the head (Megatron's vocab-parallel embedding)
    const std::string embedding = type == "gpt2" ? "wte" : "embed_tokens";
    const bool planned =
        std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.pattern == embedding; });
    if (hf_tied_head(c, type) &&
        !planned)  // the config's own entry for it stands (a plan names a module once)
        y += fmt::format("    {}{}: {}  # tied to lm_head: vocab-parallel\n", prefix, embedding,
                         style_name::rowwise);
    y +=
        fmt::format("    lm_head: {}\n", style_name::entry(style_name::colwise, "output_layouts: replicate"));
    return out;
}

HfImport import_hf_tp_plan(const std::string& config_path, const HfImportOptions& opt) {
    return import_hf_tp_plan_text(read_file(config_path, JsonLimits{}.max_bytes), config_path, opt);
}

}  // namespace ptool
