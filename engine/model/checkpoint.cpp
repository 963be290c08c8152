// --init checkpoints: sharded safetensors through their index, and key-layout conversions.
#include "model/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "core/json_reader.h"
#include "core/tensor_ops.h"

namespace ptool {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

TensorFile read_index(const std::string& path) {
    const JsonNode root =
        load_json(path, JsonLimits{64 << 20, 16});  // strict JSON, positions for every refusal
    if (!root.is_object())
        root.fail(fmt::format("a safetensors index is a JSON object, got {}", root.type_name()));
    const JsonNode map = root.at("weight_map");
    std::vector<std::pair<std::string, std::string>> wanted;  // tensor -> shard, index order
    std::map<std::string, std::string> shard_of;
    for (const auto& [name, v] : map.members("'weight_map' (tensor name: shard file)")) {
        const std::string shard = v.as_string(fmt::format("the shard of '{}'", name));
        if (shard.empty() || shard.find_first_of(std::string("/\0", 2)) != std::string::npos ||
            shard == "." || shard == "..")
            v.fail(fmt::format(
                "shard {} for '{}': a plain file name beside the index is expected (no '/', no NUL)",
                nlohmann::json(shard).dump(), name));
        if (!shard_of.emplace(name, shard).second) v.fail(fmt::format("'{}' is listed twice", name));
        wanted.emplace_back(name, shard);
    }
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    std::map<std::string, TensorFile> shards;
    for (const auto& [name, shard] : wanted)
        if (!shards.count(shard)) shards.emplace(shard, read_safetensors((dir / shard).string()));
    for (const auto& [shard, f] : shards)
        for (const auto& [name, t] : f.tensors) {
            auto it = shard_of.find(name);
            if (it == shard_of.end())
                throw InputError(SourceLocation{path, 0, 0},
                                 fmt::format("'{}' is in {} but not in the index's weight_map", name, shard));
            if (it->second != shard)
                throw InputError(SourceLocation{path, 0, 0},
                                 fmt::format("'{}' is in {}, the index says {}", name, shard, it->second));
        }
    TensorFile out;
    for (const auto& [name, shard] : wanted) {
        const Tensor* t = shards.at(shard).find(name);
        if (!t)
            throw InputError(SourceLocation{path, 0, 0},
                             fmt::format("'{}' is not in {}, where the index puts it", name, shard));
        out.add(name, *t);
    }
    out.metadata = {{"index", path}};
    return out;
}

// [rows, cols] -> [cols, rows], any dtype (bytes moved whole elements at a time).
Tensor transposed(const Tensor& t) {
    PTOOL_REQUIRE(t.dim() == 2, "transposing a {}-d tensor", t.dim());
    const int64_t r = t.size(0), c = t.size(1), es = static_cast<int64_t>(dtype_size(t.dtype()));
    Tensor out({c, r}, t.dtype());
    const auto* src = static_cast<const char*>(t.raw());
    auto* dst = static_cast<char*>(out.raw());
    for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) std::memcpy(dst + (j * r + i) * es, src + (i * c + j) * es, es);
    return out;
}

// GPT-2's checkpoints (HF's GPT2LMHeadModel and the original gpt2 repo's): keys may lack the
// "transformer." prefix; Conv1D weights are [in, out]; c_attn fuses q, k, v along out; the causal
// mask buffers attn.bias / attn.masked_bias are not parameters.
TensorFile from_hf_gpt2(const TensorFile& in, const std::string& path) {
    TensorFile out;
    out.metadata = in.metadata;
    for (const auto& [key, t] : in.tensors) {
        std::string name =
            key.rfind("transformer.", 0) == 0 || key.rfind("lm_head.", 0) == 0 ? key : "transformer." + key;
        if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;
        auto conv1d = [&](const std::string& tail) { return ends_with(name, tail); };
        const bool is_weight = ends_with(name, ".weight");
        if (conv1d(".attn.c_attn.weight") || conv1d(".attn.c_attn.bias")) {
            const Tensor w = is_weight ? transposed(t) : t;  // [3 d, d] or [3 d]
            if (w.size(0) % 3 != 0)
                throw InputError(
                    SourceLocation{path, 0, 0},
                    fmt::format("'{}' is {}: c_attn fuses q, k and v (3 x dim)", key, shape_str(t.shape())));
            const std::string stem =
                name.substr(0, name.size() - std::string(is_weight ? "c_attn.weight" : "c_attn.bias").size());
            const char* parts[] = {"q_proj", "k_proj", "v_proj"};
            for (int i = 0; i < 3; ++i)
                out.add(stem + parts[i] + (is_weight ? ".weight" : ".bias"), chunk(w, 3, i, 0));
            continue;
        }
        if (conv1d(".attn.c_proj.weight") || conv1d(".attn.c_proj.bias")) {
            const std::string tail = is_weight ? ".weight" : ".bias";
            name = name.substr(0, name.size() - std::string("c_proj" + tail).size()) + "o_proj" + tail;
            out.add(name, is_weight ? transposed(t) : t);
            continue;
        }
        if (conv1d(".mlp.c_fc.weight") || conv1d(".mlp.c_proj.weight")) {
            out.add(name, transposed(t));
            continue;
        }
        out.add(name, t);
    }
    return out;
}

// Mixtral's checkpoints (HF's MixtralForCausalLM): each expert's gated MLP is w1 (gate), w3 (up)
// and w2 (down); ptool's gated_mlp names them gate_proj, up_proj, down_proj (the same products).
TensorFile from_hf_mixtral(const TensorFile& in, const std::string&) {
    static const std::pair<const char*, const char*> names[] = {
        {".w1.", ".gate_proj."}, {".w3.", ".up_proj."}, {".w2.", ".down_proj."}};
    TensorFile out;
    out.metadata = in.metadata;
    for (const auto& [key, t] : in.tensors) {
        std::string name = key;
        if (const size_t at = name.find(".experts."); at != std::string::npos)
            for (const auto& [from, to] : names)
                if (const size_t w = name.find(from, at); w != std::string::npos) {
                    name.replace(w, std::string(from).size(), to);
                    break;
                }
        out.add(name, t);
    }
    return out;
}

using Converter = std::function<TensorFile(const TensorFile&, const std::string&)>;
const std::map<std::string, Converter>& converters() {
    static const std::map<std::string, Converter> m = {
        {"pytorch", [](const TensorFile& f, const std::string&) { return f; }},
        {"hf_gpt2", from_hf_gpt2},
        {"hf_mixtral", from_hf_mixtral},
    };
    return m;
}

}  // namespace

TensorFile read_checkpoint(const std::string& path) {
    return ends_with(path, ".json") ? read_index(path) : read_safetensors(path);
}

const std::vector<std::string>& checkpoint_formats() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const auto& [n, c] : converters()) v.push_back(n);
        return v;
    }();
    return names;
}

TensorFile to_state_dict_layout(const std::string& format, const TensorFile& file, const std::string& path) {
    auto it = converters().find(format);
    PTOOL_REQUIRE(it != converters().end(), "checkpoint_format '{}' passed the loader", format);
    if (file.state_dict_layout) return file;  // converted once already (a golden records the model's own)
    return it->second(file, path);
}

}  // namespace ptool
