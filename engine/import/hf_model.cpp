// `ptool import hf CONFIG.json`: a Hugging Face config of a family in decoder_families() or gpt2
// as a model YAML with HF's module names. The config is read as strict JSON with typed fields
// (import/hf_config.h), so every refusal points at its field: config.json:line:column. What the
// config says goes into the YAML as numbers ptool formats, names from fixed tables, or strings
// through the YAML emitter (core/yaml_writer.h): no field can add a key to the file.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include "core/model_limits.h"
#include "core/yaml_reader.h"
#include "core/yaml_writer.h"
#include "import/hf_fields.h"

namespace ptool {
namespace {

using namespace hf;  // the config's fields as the model format writes them

// Sizes of any published model stay well under these; the model's parameter count then fits in
// int64 whatever the combination (4096 layers of (4 d^2 + 3 d i) + 2 v d < 2^62).
constexpr int64_t kMaxHidden = int64_t{1} << 20, kMaxIntermediate = int64_t{1} << 22,
                  kMaxVocab = int64_t{1} << 26, kMaxPositions = int64_t{1} << 30;

// A family's mixture of experts (its config class's defaults): every decoder layer's MLP is one.
struct MoeFamily {
    std::string block;        // the block's name: Mixtral's block_sparse_moe, Qwen's mlp
    std::string experts_key;  // num_local_experts (Mixtral), num_experts (Qwen)
    int64_t experts, top_k;   // and num_experts_per_tok's default
    std::string hidden_key;   // the experts' hidden size: intermediate_size (Mixtral), moe_intermediate_size
    int64_t hidden;           // its default
    bool norm_topk_prob;      // the config class's default (Mixtral renormalises, no field)
    bool has_norm_field;      // the config has norm_topk_prob (Qwen)
    int64_t shared_hidden;    // shared_expert_intermediate_size's default (Qwen2-MoE); 0: none
};

// A config class's defaults for the fields a config may omit, as transformers declares them (main,
// 2026: configuration_<family>.py; docs/hf_import.md has the same table).
struct ClassDefaults {
    int64_t vocab, hidden, intermediate, layers, heads;
    int64_t kv_heads;  // num_key_value_heads; 0: None, which the class resolves to the heads
    int64_t max_positions;
    double rope_theta;  // transformers 5: the class's default_theta
    double rms_norm_eps;
    bool tie_word_embeddings;
    // a null the class resolves: num_key_value_heads -> the heads, head_dim -> hidden / heads; where
    // it does not (a field typed int, or no field: the attention's getattr reads None and cannot
    // build its projections), the null is exit 2 at it
    bool kv_null_is_heads, head_dim_null_ok;
    int64_t sliding_window;  // 0: none
    int64_t head_dim;        // Qwen3's field of its own; 0: hidden / heads
};

// What the family's layers are beyond Llama's.
struct DecoderTraits {
    bool qkv_bias_fixed = false;  // Qwen2: q/k/v always biased, o never
    bool qk_norm = false;         // Qwen3: q_norm and k_norm per head, and head_dim a field of its own
    // OLMo2: norms after each sub-block (x + post_attention_layernorm(self_attn(x)), x +
    // post_feedforward_layernorm(mlp(x))), none before; q_norm and k_norm over all heads' features
    bool post_norms = false;
    std::optional<MoeFamily> moe = std::nullopt;  // every layer's MLP a mixture of experts
};

// RoPE decoder families: what differs between llama, mistral, qwen2, qwen3, olmo2 and the mixtures
// of experts. One row per family in decoder_families(), below.
struct DecoderFamily : ClassDefaults, DecoderTraits {
    std::string config_class;

    DecoderFamily(std::string cls, ClassDefaults d, DecoderTraits t)
        : ClassDefaults(d), DecoderTraits(std::move(t)), config_class(std::move(cls)) {}
    // Mixtral's experts, named w1, w3, w2 in its checkpoints (checkpoint_format: hf_mixtral)
    bool mixtral() const { return moe && moe->block == "block_sparse_moe"; }
};

const std::map<std::string, DecoderFamily>& decoder_families() {
    // vocab, hidden, intermediate, layers, heads, kv_heads (0: the heads), max_position_embeddings,
    // rope_theta, rms_norm_eps, tie_word_embeddings, null kv is the heads, null head_dim is
    // hidden/heads, sliding_window (0: none), head_dim (0: hidden/heads)
    static const std::map<std::string, DecoderFamily> m = {
        {"llama",
         {"LlamaConfig", {32000, 4096, 11008, 32, 32, 0, 2048, 1e4, 1e-6, false, true, true, 0, 0}, {}}},
        {"mistral",
         {"MistralConfig",
          {32000, 4096, 14336, 32, 32, 8, 131072, 1e4, 1e-6, false, true, true, 4096, 0},
          {}}},
        {"qwen2",
         {"Qwen2Config",
          {151936, 4096, 22016, 32, 32, 32, 32768, 1e4, 1e-6, false, true, false, 4096, 0},
          {.qkv_bias_fixed = true}}},
        {"qwen3",
         {"Qwen3Config",
          {151936, 4096, 22016, 32, 32, 32, 32768, 1e4, 1e-6, false, true, false, 4096, 128},
          {.qk_norm = true}}},
        {"olmo2",
         {"Olmo2Config",
          {50304, 4096, 11008, 32, 32, 0, 2048, 1e4, 1e-5, false, true, false, 0, 0},
          {.post_norms = true}}},
        {"mixtral",
         {"MixtralConfig",
          {32000, 4096, 14336, 32, 32, 8, 131072, 1e6, 1e-5, false, true, true, 0, 0},
          {.moe = MoeFamily{"block_sparse_moe", "num_local_experts", 8, 2, "intermediate_size", 14336, true,
                            false, 0}}}},
        {"qwen2_moe",
         {"Qwen2MoeConfig",
          {151936, 2048, 5632, 24, 16, 16, 32768, 1e4, 1e-6, false, false, false, 4096, 0},
          {.qkv_bias_fixed = true,
           .moe = MoeFamily{"mlp", "num_experts", 60, 4, "moe_intermediate_size", 1408, false, true, 5632}}}},
        {"qwen3_moe",
         {"Qwen3MoeConfig",
          {151936, 2048, 6144, 24, 32, 4, 32768, 1e4, 1e-6, false, false, false, 4096, 0},
          {.qk_norm = true,
           .moe = MoeFamily{"mlp", "num_experts", 128, 8, "moe_intermediate_size", 768, false, true, 0}}}},
    };
    return m;
}

// GPT2Config's defaults (configuration_gpt2.py; tie_word_embeddings: PretrainedConfig's true)
struct Gpt2Defaults {
    int64_t vocab = 50257, positions = 1024, embd = 768, layers = 12, heads = 12;  // n_inner: 4 x n_embd
    double layer_norm_epsilon = 1e-5, pdrop = 0.1;
    bool tie_word_embeddings = true;
};
constexpr Gpt2Defaults kGpt2;

// The mixture of experts' YAML entry (", ..." after the common keys), from the family and config.
std::string moe_entry(const HfConfig& c, const MoeFamily& m, int64_t d, int64_t layers) {
    const int64_t experts = c.pos(m.experts_key, m.experts), top_k = c.pos("num_experts_per_tok", m.top_k),
                  hidden = size_field(c, m.hidden_key, m.hidden, kMaxIntermediate);
    if (experts > 4096) c.fail_at(m.experts_key, fmt::format("{} experts is over ptool's 4096", experts));
    // the model's modules, at most (a layer: its containers, norms, attention and projections, the
    // moe's gate and shared expert, 4 per expert): refused here, at the config's field, rather than
    // in the YAML this writes (core/model_limits.h)
    if (const int64_t modules = layers * (24 + 4 * experts) + 8; modules > kMaxModules)
        c.fail_at(
            m.experts_key,
            fmt::format("{} layers of {} experts are about {} modules (4 per expert), over ptool's limit "
                        "of {}: fewer layers or experts",
                        layers, experts, modules, kMaxModules));
    if (top_k > experts)
        c.fail_at("num_experts_per_tok",
                  fmt::format("num_experts_per_tok {} is more than the {} experts", top_k, experts));
    if (c.pos("decoder_sparse_step", 1) != 1)
        c.fail_at("decoder_sparse_step",
                  "layers that alternate dense and sparse MLPs are not modelled (every layer is one block)");
    if (c.set("mlp_only_layers") &&
        !(c.at("mlp_only_layers").value().is_array() && c.at("mlp_only_layers").value().empty()))
        c.fail_at("mlp_only_layers",
                  "dense-MLP layers among sparse ones are not modelled (every layer is one block)");
    const bool norm = m.has_norm_field ? c.flag("norm_topk_prob", m.norm_topk_prob) : m.norm_topk_prob;
    std::string y = fmt::format(", dim: {}, hidden: {}, experts: {}, top_k: {}, norm_topk_prob: {}", d,
                                hidden, experts, top_k, norm);
    if (m.shared_hidden) {
        const int64_t shared =
            size_field(c, "shared_expert_intermediate_size", m.shared_hidden, kMaxIntermediate);
        y += fmt::format(", shared_hidden: {}, shared_gate: true", shared);
    }
    return y;
}

// A decoder config's sizes, read and checked at their fields.
struct DecoderSizes {
    int64_t vocab, d, inter, layers, heads, kv, max_pos;
    double eps;
    RopeFields rope;  // theta and scaling
    int64_t hd;       // the attention's head dim
    Shape2 b;
};

DecoderSizes decoder_sizes(const HfConfig& c, const DecoderFamily& f, const HfImportOptions& opt) {
    const int64_t vocab = size_field(c, "vocab_size", f.vocab, kMaxVocab),
                  d = size_field(c, "hidden_size", f.hidden, kMaxHidden),
                  inter = size_field(c, "intermediate_size", f.intermediate, kMaxIntermediate),
                  layers = c.pos("num_hidden_layers", f.layers),
                  heads = c.pos("num_attention_heads", f.heads),
                  kv = f.kv_null_is_heads && c.null("num_key_value_heads")
                           ? heads
                           : c.pos("num_key_value_heads", f.kv_heads ? f.kv_heads : heads),
                  max_pos = size_field(c, "max_position_embeddings", f.max_positions, kMaxPositions);
    if (layers > 4096)
        c.fail_at("num_hidden_layers",
                  fmt::format("num_hidden_layers {} is over ptool's 4096 (repeat)", layers));
    const double eps = positive_field(c, "rms_norm_eps", f.rms_norm_eps);
    const RopeFields r = rope(c, f.rope_theta, max_pos);
    if (d % heads)
        c.fail_at("num_attention_heads",
                  fmt::format("hidden_size {} is not a multiple of num_attention_heads {}", d, heads));
    if (heads % kv)
        c.fail_at(
            "num_key_value_heads",
            fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}", heads, kv));
    // Qwen3's head_dim is a field of its own (q_proj is hidden -> heads x head_dim); the others' heads
    // are hidden / heads. given: 0 where absent, or null in a class that resolves None
    const int64_t given =
        f.head_dim_null_ok && c.null("head_dim") ? 0 : size_field(c, "head_dim", 0, kMaxHidden);
    const int64_t hd = f.qk_norm ? (given ? given : f.head_dim ? f.head_dim : d / heads) : d / heads;
    if (hd % 2)  // found by fuzz_hf_config: the written model did not load
        c.fail_at(f.qk_norm && given ? "head_dim" : "num_attention_heads",
                  fmt::format("the head dim {} is odd: RoPE rotates pairs", hd));
    if (!f.qk_norm && given && given != d / heads)
        c.fail_at(
            "head_dim",
            fmt::format("head_dim {} differs from hidden_size / num_attention_heads = {}: ptool's attention "
                        "has heads of hidden/heads",
                        given, d / heads));
    return {vocab, d, inter, layers, heads, kv, max_pos, eps, r, hd, batch_shape(opt, max_pos)};
}

// Whether some layer's attention slides: `layer_types` where the config lists them (a
// "sliding_attention" among them); else Qwen's families slide with use_sliding_window, on layers
// max_window_layers (28, their classes' default) and after, as transformers' config classes derive
// layer_types; Llama's and Mistral's on every layer.
bool some_layer_slides(const HfConfig& c, const std::string& type, int64_t layers) {
    if (c.set("layer_types")) {
        const std::vector<JsonNode> kinds = c.at("layer_types").items("'layer_types'");
        if (static_cast<int64_t>(kinds.size()) != layers)
            c.fail_at("layer_types",
                      fmt::format("'layer_types' lists {} layers, the model has {}", kinds.size(), layers));
        for (const JsonNode& k : kinds)
            if (k.as_string("a layer type") == "sliding_attention") return true;
        return false;
    }
    if (type.rfind("qwen", 0) != 0) return true;
    return c.flag("use_sliding_window", false) &&
           c.num("max_window_layers", 28) < static_cast<double>(layers);  // (0: every layer)
}

// A sliding window shorter than the sequence on some layer is refused (not modelled).
void check_sliding_window(const HfConfig& c, const std::string& type, const DecoderFamily& f,
                          const DecoderSizes& s) {
    const int64_t seq = s.b.seq;
    // absent: the config class's default; null: none
    const int64_t window = c.present("sliding_window") ? c.pos("sliding_window", 0) : f.sliding_window;
    if (window > 0 && window < seq && some_layer_slides(c, type, s.layers)) {
        const std::string key = c.set("sliding_window") ? "sliding_window" : "model_type";
        c.fail_at(
            key, fmt::format(
                     "sliding-window attention (window {}) over sequences of {} is not modelled; a window of "
                     "at least the sequence is plain causal attention (--seq {})",
                     window, seq, window));
    }
}

// What the config changes in the computation: refused at the field where ptool does not model it,
// warned about (out.warnings) where it only differs in training noise.
struct DecoderChoices {
    std::string moe;  // the moe's entry (", ..."), or ""
    Act act;
    bool qkv_bias, o_bias, mlp_bias, tied;
    AttnChoice attn;
};

DecoderChoices decoder_choices(const HfConfig& c, const std::string& type, const DecoderFamily& f,
                               const DecoderSizes& s, const HfImportOptions& opt, HfImport& out) {
    DecoderChoices ch;
    if (!f.moe)
        for (const char* moe : {"num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                "moe_intermediate_size"})
            c.refuse_if_set(moe, fmt::format("a {} has no mixture-of-experts layers", f.config_class));
    ch.moe = f.moe ? moe_entry(c, *f.moe, s.d, s.layers) : "";
    if (f.moe) {
        if (const double j = c.num("router_jitter_noise", 0.0); j != 0)
            out.warnings.push_back(fmt::format(
                "router_jitter_noise {} is not modelled (the router's input is not jittered)", j));
        if (c.flag("output_router_logits", false))
            out.warnings.push_back(
                "output_router_logits: transformers' load-balancing loss (one over every layer's router "
                "logits concatenated) is not modelled; `aux_loss_coef` on a moe adds Switch Transformer's "
                "per "
                "layer, in Megatron's form (docs/model_format.md)");
    }
    if (c.pos("pretraining_tp", 1) != 1)
        c.fail_at("pretraining_tp", "'pretraining_tp' > 1 (sliced projections) is not modelled");
    check_sliding_window(c, type, f, s);
    if (const double p = dropout_field(c, "attention_dropout", 0.0); p > 0)
        out.warnings.push_back(fmt::format(
            "attention_dropout {} is not modelled (the attention probabilities are not dropped)", p));
    ch.act = activation(c, "hidden_act", "silu");
    if (ch.act.gated.empty()) c.fail_at("hidden_act", "the gated MLP computes silu, relu, gelu or tanh");
    const bool bias = c.flag("attention_bias", false);
    ch.mlp_bias = c.flag("mlp_bias", false);
    ch.qkv_bias = f.qkv_bias_fixed || bias;
    ch.o_bias = !f.qkv_bias_fixed && bias;
    ch.tied = c.flag("tie_word_embeddings", f.tie_word_embeddings);
    ch.attn = attention_choice(c, opt);
    return ch;
}

// The file's header comment: where it came from, how its names read, its dtypes, its attention
// and what is not modelled.
void write_decoder_header(std::string& y, const HfConfig& c, const std::string& type, const DecoderFamily& f,
                          const AttnChoice& attn, const std::vector<std::string>& warnings) {
    y += fmt::format("# {} ({}, model_type {}) from {}: `ptool import hf`.\n", model_name(c, type),
                     f.config_class, type, yaml_comment(c.root().file()));
    if (f.mixtral())
        y += "# Mixtral's experts are gated MLPs named w1, w3, w2 in its checkpoints: gate_proj, up_proj,\n"
             "# down_proj here (the same products); checkpoint_format: hf_mixtral reads them by those "
             "names.\n";
    y += f.post_norms ? "# Names are HF's: each decoder layer is two unnamed residuals, OLMo2's norms after "
                        "each block\n"
                        "# (x + post_attention_layernorm(self_attn(x)), x + "
                        "post_feedforward_layernorm(mlp(x))); q_norm\n"
                        "# and k_norm normalise all of q's and k's features at once (qk_norm: full).\n"
                      : "# Names are HF's: each decoder layer is two unnamed residuals (x + "
                        "self_attn(input_layernorm(x)),\n"
                        "# x + mlp(post_attention_layernorm(x))), so parameters read "
                        "model.layers.N.self_attn.q_proj.weight.\n";
    y += fmt::format(
        "# Float32 masters (torch_dtype {} is the checkpoint's; plans add bf16 compute with\n"
        "# data_parallel.mixed_precision). Optimizer: torch.optim.AdamW's defaults.\n",
        yaml_comment(c.str("torch_dtype", "unset")));
    y +=
        "# Norms: implementation eager, as transformers' RMSNorm runs (x.to(float32), normalise, cast back,\n"
        "# then the weight): what PyTorch keeps for its backward and its kernels' time "
        "(docs/model_format.md).\n";
    y += attention_comment(attn);
    for (const std::string& w : warnings) y += "# Not modelled: " + w + "\n";
}

// The model's keys and its module tree, HF's names: embed_tokens, the repeated decoder layer (two
// residuals), the final norm and lm_head.
void write_decoder_model(std::string& y, const HfConfig& c, const std::string& type, const DecoderFamily& f,
                         const DecoderSizes& s, const DecoderChoices& ch) {
    const int64_t d = s.d, vocab = s.vocab;
    const std::string eps = yaml_number(s.eps);
    y += fmt::format("name: {}\nseed: 0\n{}batch:\n  input: {{tokens: [{}, {}], vocab: {}}}\nmodules:\n",
                     yaml_scalar(model_name(c, type)), f.mixtral() ? "checkpoint_format: hf_mixtral\n" : "",
                     s.b.batch, s.b.seq, vocab);
    y += "  - name: model\n    type: sequential\n    modules:\n";
    y += fmt::format("      - {{name: embed_tokens, type: embedding, vocab: {}, dim: {}}}\n", vocab, d);
    y += fmt::format("      - name: layers\n        type: repeat\n        count: {}\n        modules:\n",
                     s.layers);
    y += "          - type: residual\n            modules:\n";
    if (!f.post_norms)
        y += fmt::format(
            "              - {{name: input_layernorm, type: rms_norm, dim: {}, eps: {}, implementation: "
            "eager}}\n",
            d, eps);
    const std::string qk = f.post_norms ? fmt::format(", qk_norm: full, qk_norm_eps: {}", eps)
                           : f.qk_norm
                               ? fmt::format(", head_dim: {}, qk_norm: true, qk_norm_eps: {}", s.hd, eps)
                               : "";
    y += fmt::format(
        "              - {{name: self_attn, type: attention, dim: {}, heads: {}, kv_heads: {}{}, causal: "
        "true, "
        "attn_implementation: {}, rope_theta: {}{}, qkv_bias: {}, o_bias: {}}}\n",
        d, s.heads, s.kv, qk, ch.attn.impl, yaml_number(s.rope.theta), s.rope.scaling, ch.qkv_bias,
        ch.o_bias);
    const std::string post_attention = fmt::format(
        "              - {{name: post_attention_layernorm, type: rms_norm, dim: {}, eps: {}, implementation: "
        "eager}}\n",
        d, eps);
    if (f.post_norms) y += post_attention;
    y += "          - type: residual\n            modules:\n";
    if (!f.post_norms) y += post_attention;
    if (f.moe) {
        if (ch.act.gated != "silu") c.fail_at("hidden_act", "a mixture of experts' experts compute silu");
        y += fmt::format("              - {{name: {}, type: moe{}}}\n", f.moe->block, ch.moe);
    } else {
        y += fmt::format(
            "              - {{name: mlp, type: gated_mlp, dim: {}, hidden: {}, activation: {}, bias: {}}}\n",
            d, s.inter, ch.act.gated, ch.mlp_bias);
    }
    if (f.post_norms)
        y += fmt::format(
            "              - {{name: post_feedforward_layernorm, type: rms_norm, dim: {}, eps: {}, "
            "implementation: eager}}\n",
            d, eps);
    y += fmt::format("      - {{name: norm, type: rms_norm, dim: {}, eps: {}, implementation: eager}}\n", d,
                     eps);
    y += fmt::format("  - {{name: lm_head, type: linear, in: {}, out: {}, bias: false{}}}\n", d, vocab,
                     ch.tied ? ", tie: model.embed_tokens" : "");
    // transformers' _init_weights: linears and embeddings ~ N(0, initializer_range), biases 0
    y += fmt::format("init: {{std: {}}}\n", yaml_number(positive_field(c, "initializer_range", 0.02)));
    y += "loss: cross_entropy\noptimizer: {type: adamw}\n";
}

// A RoPE decoder family's config: its sizes, then what changes the computation (both checked at
// their fields before anything is written), then the file.
HfImport decoder(const HfConfig& c, const std::string& type, const DecoderFamily& f,
                 const HfImportOptions& opt) {
    HfImport out;
    const DecoderSizes s = decoder_sizes(c, f, opt);
    const DecoderChoices ch = decoder_choices(c, type, f, s, opt, out);
    write_decoder_header(out.yaml, c, type, f, ch.attn, out.warnings);
    write_decoder_model(out.yaml, c, type, f, s, ch);
    return out;
}

HfImport gpt2(const HfConfig& c, const HfImportOptions& opt) {
    HfImport out;
    // n_inner absent or null (save_pretrained writes None): 4 x n_embd, as GPT2Block resolves it
    const int64_t vocab = size_field(c, "vocab_size", kGpt2.vocab, kMaxVocab),
                  positions = size_field(c, "n_positions", kGpt2.positions, kMaxPositions),
                  d = size_field(c, "n_embd", kGpt2.embd, kMaxHidden),
                  layers = c.pos("n_layer", kGpt2.layers), heads = c.pos("n_head", kGpt2.heads),
                  inner = size_field(c, "n_inner", 4 * d, kMaxIntermediate);
    if (layers > 4096) c.fail_at("n_layer", fmt::format("n_layer {} is over ptool's 4096 (repeat)", layers));
    if (d % heads) c.fail_at("n_head", fmt::format("n_embd {} is not a multiple of n_head {}", d, heads));
    const double eps = positive_field(c, "layer_norm_epsilon", kGpt2.layer_norm_epsilon),
                 embd = dropout_field(c, "embd_pdrop", kGpt2.pdrop),
                 resid = dropout_field(c, "resid_pdrop", kGpt2.pdrop);
    const Shape2 b = batch_shape(opt, positions);
    if (b.seq > positions)
        throw InputError(fmt::format("--seq {} is longer than n_positions {}", b.seq, positions));
    if (!c.flag("scale_attn_weights", true))
        c.fail_at("scale_attn_weights", "unscaled attention scores are not modelled");
    c.refuse_if_set("scale_attn_by_inverse_layer_idx", "per-layer score scaling is not modelled");
    c.refuse_if_set("add_cross_attention", "cross-attention is not modelled");
    if (const double p = dropout_field(c, "attn_pdrop", kGpt2.pdrop); p > 0)
        out.warnings.push_back(
            fmt::format("attn_pdrop {} is not modelled (the attention probabilities are not dropped)", p));
    const Act act = activation(c, "activation_function", "gelu_new");
    const bool tied = c.flag("tie_word_embeddings", kGpt2.tie_word_embeddings);
    const AttnChoice attn = attention_choice(c, opt);

    std::string& y = out.yaml;
    y += fmt::format("# {} (GPT2Config, model_type gpt2) from {}: `ptool import hf`.\n",
                     model_name(c, "gpt2"), yaml_comment(c.root().file()));
    y +=
        "# Names are HF's except inside attention: GPT-2's Conv1D c_attn ([in, 3 out]) is three projections "
        "here,\n"
        "# attn.q_proj/k_proj/v_proj ([out, in] each), and attn.c_proj is attn.o_proj. checkpoint_format: "
        "hf_gpt2\n"
        "# makes --init split and transpose them (docs/hf_import.md). Each block is two unnamed residuals.\n";
    y += attention_comment(attn);
    for (const std::string& w : out.warnings) y += "# Not modelled: " + w + "\n";
    y += fmt::format(
        "name: {}\nseed: 0\ncheckpoint_format: hf_gpt2\nbatch:\n  input: {{tokens: [{}, {}], vocab: "
        "{}}}\nmodules:\n",
        yaml_scalar(model_name(c, "gpt2")), b.batch, b.seq, vocab);
    y += "  - name: transformer\n    type: sequential\n    modules:\n";
    y += fmt::format("      - {{name: wte, type: embedding, vocab: {}, dim: {}}}\n", vocab, d);
    y += fmt::format("      - {{name: wpe, type: position_embedding, positions: {}, dim: {}}}\n", positions,
                     d);
    y += fmt::format("      - {{name: drop, type: dropout, p: {}}}\n", yaml_number(embd));
    y += fmt::format("      - name: h\n        type: repeat\n        count: {}\n        modules:\n", layers);
    y += "          - type: residual\n            modules:\n";
    y += fmt::format("              - {{name: ln_1, type: layer_norm, dim: {}, eps: {}}}\n", d,
                     yaml_number(eps));
    y += fmt::format(
        "              - {{name: attn, type: attention, dim: {}, heads: {}, causal: true, "
        "attn_implementation: {}}}\n",
        d, heads, attn.impl);
    y += fmt::format("              - {{name: resid_dropout, type: dropout, p: {}}}\n", yaml_number(resid));
    y += "          - type: residual\n            modules:\n";
    y += fmt::format("              - {{name: ln_2, type: layer_norm, dim: {}, eps: {}}}\n", d,
                     yaml_number(eps));
    y += "              - name: mlp\n                type: sequential\n                modules:\n";
    y += fmt::format("                  - {{name: c_fc, type: linear, in: {}, out: {}}}\n", d, inner);
    std::string act_yaml = act.module;
    act_yaml.insert(1, "name: act, ");
    y += fmt::format("                  - {}\n", act_yaml);
    y += fmt::format("                  - {{name: c_proj, type: linear, in: {}, out: {}}}\n", inner, d);
    y += fmt::format("                  - {{name: dropout, type: dropout, p: {}}}\n", yaml_number(resid));
    y += fmt::format("      - {{name: ln_f, type: layer_norm, dim: {}, eps: {}}}\n", d, yaml_number(eps));
    y += fmt::format("  - {{name: lm_head, type: linear, in: {}, out: {}, bias: false{}}}\n", d, vocab,
                     tied ? ", tie: transformer.wte" : "");
    // transformers' GPT-2 init: N(0, initializer_range), the residual projections (c_proj) scaled by
    // 1 / sqrt(2 n_layer) (GPT2PreTrainedModel._init_weights), biases 0
    const double std = positive_field(c, "initializer_range", 0.02);
    y += fmt::format(
        "init: {{std: {}, std_by_param: {{\"transformer.h.*.attn.o_proj.weight\": {}, "
        "\"transformer.h.*.mlp.c_proj.weight\": "
        "{}}}}}\n",
        yaml_number(std), yaml_number(std / std::sqrt(2.0 * static_cast<double>(layers))),
        yaml_number(std / std::sqrt(2.0 * static_cast<double>(layers))));
    y += "loss: cross_entropy\noptimizer: {type: adamw}\n";
    return out;
}

using Importer = std::function<HfImport(const HfConfig&, const HfImportOptions&)>;

const std::map<std::string, Importer>& importers() {
    static const std::map<std::string, Importer> m = [] {
        std::map<std::string, Importer> m;
        for (const auto& entry : decoder_families())  // (clang before 16 captures no structured binding)
            m.emplace(entry.first,
                      [type = entry.first, f = &entry.second](const HfConfig& c, const HfImportOptions& o) {
                          return decoder(c, type, *f, o);
                      });
        m.emplace("gpt2", [](const HfConfig& c, const HfImportOptions& o) { return gpt2(c, o); });
        return m;
    }();
    return m;
}

}  // namespace

std::string hf_model_type(const HfConfig& c) {
    const std::string type = c.at("model_type").as_string("'model_type'");
    std::vector<std::string> names;
    for (const auto& [n, f] : importers()) names.push_back(n);
    if (!importers().count(type))
        c.fail_at("model_type",
                  fmt::format("model_type '{}' is not one ptool imports{}", type, did_you_mean(type, names)));
    return type;
}

bool hf_tied_head(const HfConfig& c, const std::string& type) {
    const auto& families = decoder_families();
    const auto f = families.find(type);
    return c.flag("tie_word_embeddings",
                  f != families.end() ? f->second.tie_word_embeddings : kGpt2.tie_word_embeddings);
}

HfImport import_hf_model_text(const std::string& text, const std::string& name, const HfImportOptions& opt) {
    if (opt.batch <= 0 || opt.seq < 0)
        throw InputError(fmt::format("--batch {} --seq {}: sizes must be positive", opt.batch, opt.seq));
    const HfConfig c(text, name);
    return importers().at(hf_model_type(c))(c, opt);
}

HfImport import_hf_model(const std::string& config_path, const HfImportOptions& opt) {
    return import_hf_model_text(read_file(config_path, JsonLimits{}.max_bytes), config_path, opt);
}

}  // namespace ptool
