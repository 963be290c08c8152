// A Hugging Face config's fields read as the model format writes them (hf_fields.h).
#include "import/hf_fields.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "core/yaml_reader.h"

namespace ptool {
namespace {

// transformers' attn_implementation names and the model format's, as the model format's: eager
// keeps the softmax probabilities [B*H, T, T] for backward (HF's eager); SDPA's flash and
// memory-efficient kernels, FlashAttention 2 and 3 and FlexAttention keep no score matrix, as the
// model format's flash does.
const std::map<std::string, std::string>& attn_implementations() {
    static const std::map<std::string, std::string> m = {
        {"eager", "eager"},
        {"flash", "flash"},
        {"sdpa", "flash"},
        {"flash_attention_2", "flash"},
        {"flash_attention_3", "flash"},
        {"flex_attention", "flash"},
    };
    return m;
}

}  // namespace

std::vector<std::string> hf_attn_names() {
    std::vector<std::string> names;
    for (const auto& [name, impl] : attn_implementations()) names.push_back(name);
    return names;
}

namespace hf {

std::string yaml_number(double v) {
    std::string s = fmt::format("{}", v);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

std::string model_name(const HfConfig& c, const std::string& type) {
    std::string n = c.str("_name_or_path", "");
    while (!n.empty() && n.back() == '/') n.pop_back();
    if (auto slash = n.rfind('/'); slash != std::string::npos) n = n.substr(slash + 1);
    std::string out;
    for (char ch : n)
        out += std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.' ? ch : '_';
    return out.empty() ? type : out;
}

Act activation(const HfConfig& c, const std::string& key, const std::string& fallback) {
    const std::string a = c.str(key, fallback);
    static const std::map<std::string, Act> known = {
        {"silu", {"silu", "{type: silu}"}},
        {"swish", {"silu", "{type: silu}"}},
        {"relu", {"relu", "{type: relu}"}},
        {"gelu", {"gelu", "{type: gelu}"}},
        {"tanh", {"tanh", "{type: tanh}"}},
        {"gelu_new", {"", "{type: gelu, approximate: tanh}"}},
        {"gelu_pytorch_tanh", {"", "{type: gelu, approximate: tanh}"}},
    };
    auto it = known.find(a);
    if (it == known.end()) {
        std::vector<std::string> names;
        for (const auto& [n, x] : known) names.push_back(n);
        c.fail_at(key, fmt::format("activation '{}' is not one ptool computes{}", a, did_you_mean(a, names)));
    }
    return it->second;
}

namespace {

// One RoPE dict (transformers 4's rope_scaling, 5's rope_parameters) as the attention's
// ", rope_scaling: {...}", "" for none. `what` names it; `type_default` is its type when it names
// none (rope_parameters: "default", as standardize_rope_params sets it; rope_scaling: none,
// required); `original_max` llama3's original_max_position_embeddings when absent (0: required,
// as transformers 4 requires it in rope_scaling; 5 sets max_position_embeddings).
std::string scaling_of(const JsonNode& node, const std::string& what, const char* type_default,
                       double original_max) {
    if (!node.is_object()) node.fail(fmt::format("'{}' must be an object, got {}", what, node.type_name()));
    const auto type_node = node.get("rope_type") ? node.get("rope_type") : node.get("type");
    if (!type_node && !type_default) node.fail(fmt::format("'{}' has no 'rope_type' (or 'type')", what));
    const std::string type =
        type_node ? type_node->as_string(fmt::format("{}'s 'rope_type'", what)) : type_default;
    if (auto p = node.get("partial_rotary_factor");
        p && !p->is_null() && p->as_number(fmt::format("{} 'partial_rotary_factor'", what)) != 1)
        p->fail(fmt::format("{} 'partial_rotary_factor' (RoPE on part of each head) is not modelled", what));
    if (type == "default") return "";
    if (type != "linear" && type != "llama3")
        node.fail(fmt::format("{} type '{}' is not modelled (ptool computes linear and llama3)", what, type));
    auto num = [&](const char* key, double fallback) {
        if (fallback > 0 && !node.get(key)) return fallback;
        const JsonNode n = node.at(key);
        const double v = n.as_number(fmt::format("{} '{}'", what, key));
        if (!(v > 0) || v > 1e12) n.fail(fmt::format("{} '{}' must be a number in (0, 1e12]", what, key));
        return v;
    };
    std::string out =
        fmt::format(", rope_scaling: {{type: {}, factor: {}", type, yaml_number(num("factor", 0)));
    if (type == "llama3") {
        const double low = num("low_freq_factor", 0), high = num("high_freq_factor", 0);
        if (!(high > low))
            node.at("high_freq_factor")
                .fail(fmt::format("{} 'high_freq_factor' must be above 'low_freq_factor'", what));
        out +=
            fmt::format(", low_freq_factor: {}, high_freq_factor: {}, original_max_position_embeddings: {}",
                        yaml_number(low), yaml_number(high),
                        yaml_number(num("original_max_position_embeddings", original_max)));
    }
    return out + "}";
}

std::string scaling_words(const std::string& scaling) {  // for the messages
    return scaling.empty() ? "no scaling" : scaling.substr(2);
}

}  // namespace

RopeFields rope(const HfConfig& c, double theta_default, int64_t max_positions) {
    const std::optional<JsonNode> legacy = c.set("rope_scaling") ? std::optional(c.at("rope_scaling"))
                                                                 : std::nullopt,
                                  params = c.set("rope_parameters") ? std::optional(c.at("rope_parameters"))
                                                                    : std::nullopt;
    // theta: the top-level rope_theta (transformers 4), rope_parameters' (5; rope_scaling's, which 5
    // reads as rope_parameters): those given must agree, a config read the same by both
    std::optional<std::pair<double, std::string>> theta;
    auto take_theta = [&](const JsonNode& n, const std::string& what) {
        const double v = n.as_number(what);
        if (!(v > 0) || v > 1e30) n.fail(fmt::format("{} must be a number in (0, 1e30], got {}", what, v));
        if (theta && theta->first != v)
            n.fail(
                fmt::format("{} {} disagrees with {} {}: transformers 4 reads the top-level 'rope_theta', 5 "
                            "the one in 'rope_parameters' (or 'rope_scaling'); give one, or the same value",
                            what, yaml_number(v), theta->second, yaml_number(theta->first)));
        if (!theta) theta = {v, what};
    };
    if (c.present("rope_theta")) {
        c.num("rope_theta", 0);  // null: refused (the class keeps None)
        take_theta(c.at("rope_theta"), "'rope_theta'");
    }
    std::string scaling;
    if (legacy) {
        scaling = scaling_of(*legacy, "rope_scaling", nullptr, 0);
        if (auto t = legacy->get("rope_theta"); t && !t->is_null())
            take_theta(*t, "rope_scaling's 'rope_theta'");
    }
    if (params) {
        if (params->is_object())
            for (const auto& [key, v] : params->members("'rope_parameters'"))
                if (v.is_object())  // {"full_attention": {...}, "sliding_attention": {...}}
                    v.fail(
                        fmt::format("'rope_parameters' gives RoPE per layer type ('{}'): not modelled, "
                                    "every layer of the imported model has the same RoPE",
                                    key));
        const std::string p =
            scaling_of(*params, "rope_parameters", "default", static_cast<double>(max_positions));
        if (legacy && p != scaling)
            params->fail(
                fmt::format("'rope_parameters' ({}) disagrees with 'rope_scaling' ({}): transformers takes "
                            "'rope_scaling' where both are given; give one form, or the same RoPE in both",
                            scaling_words(p), scaling_words(scaling)));
        if (!legacy) scaling = p;
        if (auto t = params->get("rope_theta"); t && !t->is_null())
            take_theta(*t, "rope_parameters' 'rope_theta'");
    }
    return {theta ? theta->first : theta_default, scaling};
}

int64_t size_field(const HfConfig& c, const std::string& key, int64_t fallback, int64_t max) {
    const int64_t v = c.pos(key, fallback);
    if (v > max) c.fail_at(key, fmt::format("'{}' {} is over ptool's limit of {}", key, v, max));
    return v;
}

double positive_field(const HfConfig& c, const std::string& key, double fallback) {
    const double v = c.num(key, fallback);
    if (!(v > 0) || v > 1e30)
        c.fail_at(key, fmt::format("'{}' must be a number in (0, 1e30], got {}", key, v));
    return v;
}

double dropout_field(const HfConfig& c, const std::string& key, double fallback) {
    const double p = c.num(key, fallback);
    if (!(p >= 0 && p < 1)) c.fail_at(key, fmt::format("'{}' must be in [0, 1), got {}", key, p));
    return p;
}

AttnChoice attention_choice(const HfConfig& c, const HfImportOptions& opt) {
    const auto& known = attn_implementations();
    if (!opt.attn.empty()) {
        auto it = known.find(opt.attn);
        if (it == known.end())
            throw InputError(
                fmt::format("--attn '{}': valid: {}", opt.attn, fmt::join(hf_attn_names(), ", ")));
        return {it->second, fmt::format("--attn {}", it->first)};
    }
    std::optional<AttnChoice> found;
    for (const char* key : {"attn_implementation", "_attn_implementation"}) {
        if (!c.set(key)) continue;
        const std::string v = c.str(key, "");
        auto it = known.find(v);
        if (it == known.end())
            c.fail_at(
                key, fmt::format("'{}' '{}' is not an attention ptool models (valid: {}; --attn overrides "
                                 "the config){}",
                                 key, v, fmt::join(hf_attn_names(), ", "), did_you_mean(v, hf_attn_names())));
        if (found && found->impl != it->second)
            c.fail_at(key,
                      fmt::format("'{}' '{}' disagrees with 'attn_implementation' (--attn chooses)", key, v));
        if (!found) found = AttnChoice{it->second, fmt::format("the config's {} \"{}\"", key, it->first)};
    }
    if (found) return *found;
    return {"flash", "transformers' default attn_implementation \"sdpa\""};
}

std::string attention_comment(const AttnChoice& a) {
    std::string y = fmt::format("# Attention: {} ({}).\n", a.impl, a.why);
    if (a.impl == "flash")
        return y +
               "# No [batch x heads, seq, seq] scores kept, as SDPA's flash and memory-efficient kernels "
               "keep\n"
               "# none; --attn eager keeps them for backward (HF's eager). --attn wins over the config.\n";
    return y +
           "# The softmax probabilities [batch x heads, seq, seq] kept for backward (HF's eager);\n"
           "# transformers' default, sdpa, keeps none: --attn sdpa writes flash.\n";
}

Shape2 batch_shape(const HfImportOptions& opt, int64_t max_positions) {
    const Shape2 b{opt.batch, opt.seq > 0 ? opt.seq : std::min<int64_t>(max_positions, 2048)};
    if (b.batch > (int64_t{1} << 40) / b.seq)
        throw InputError(fmt::format("--batch {} --seq {}: {} tokens per step is over ptool's limit of 2^40",
                                     b.batch, b.seq,
                                     static_cast<double>(b.batch) * static_cast<double>(b.seq)));
    return b;
}

}  // namespace hf
}  // namespace ptool
