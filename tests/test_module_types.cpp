// The module-type registry (model/module_type.h): every registered type's parameter count is what
// building it allocates, the registry refuses a second type of one name, unknown types are offered
// in their listed order, and the types' rules are what the plan writer and shrink read.
#include <map>
#include <set>

#include "model/model.h"
#include "model/module_type.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_module_types {

namespace {

// Each registered type's examples: a batch and modules that use it in its several shapes (bias or
// not, tied, grouped-query, ...). A new type fails the first test until it has its own here.
const std::map<std::string, std::vector<std::string>> kExamples = {
    {"linear",
     {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: linear, in: 8, out: 6}\n",
      "batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: linear, in: 8, out: 6, bias: false}\n",
      "batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: linear, in: 8, out: 8}\n"
      "  - {name: b, type: linear, in: 8, out: 8, tie: a}\n"}},
    {"relu", {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: relu}\n"}},
    {"gelu", {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: gelu, approximate: tanh}\n"}},
    {"silu", {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: silu}\n"}},
    {"tanh", {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: tanh}\n"}},
    {"identity", {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: identity}\n"}},
    {"layer_norm",
     {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: layer_norm, dim: 8}\n",
      "batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: layer_norm, dim: 8, bias: false}\n",
      "batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: layer_norm, dim: 8, elementwise_affine: "
      "false}\n"}},
    {"rms_norm",
     {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: rms_norm, dim: 8}\n",
      "batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: rms_norm, dim: 8, elementwise_affine: "
      "false}\n"}},
    {"batch_norm", {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: batch_norm, features: 8}\n"}},
    {"embedding",
     {"batch: {input: {tokens: [2, 5], vocab: 11}}\nmodules:\n  - {name: e, type: embedding, vocab: 11, dim: "
      "6}\n"}},
    {"position_embedding",
     {"batch: {input: [2, 5, 6]}\nmodules:\n  - {name: p, type: position_embedding, positions: 7, dim: "
      "6}\n"}},
    {"dropout", {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: dropout, p: 0.1}\n"}},
    {"attention",
     {"batch: {input: [2, 3, 8]}\nmodules:\n  - {name: a, type: attention, dim: 8, heads: 4}\n",
      "batch: {input: [2, 3, 8]}\nmodules:\n  - {name: a, type: attention, dim: 8, heads: 4, kv_heads: 2, "
      "bias: false}\n",
      "batch: {input: [2, 3, 8]}\nmodules:\n  - {name: a, type: attention, dim: 8, heads: 4, kv_heads: 1, "
      "o_bias: false, "
      "rope_theta: 10000}\n",
      "batch: {input: [2, 3, 8]}\nmodules:\n  - {name: a, type: attention, dim: 8, heads: 4, kv_heads: 2, "
      "head_dim: 6, qk_norm: true, bias: false, rope_theta: 10000}\n"}},
    {"gated_mlp",
     {"batch: {input: [2, 3, 8]}\nmodules:\n  - {name: m, type: gated_mlp, dim: 8, hidden: 12}\n",
      "batch: {input: [2, 3, 8]}\nmodules:\n  - {name: m, type: gated_mlp, dim: 8, hidden: 12, bias: true, "
      "activation: gelu}\n"}},
    {"moe",
     {"batch: {input: [2, 3, 8]}\nmodules:\n  - {name: m, type: moe, dim: 8, hidden: 12, experts: 4, top_k: "
      "2}\n",
      "batch: {input: [2, 3, 8]}\nmodules:\n  - {name: m, type: moe, dim: 8, hidden: 12, experts: 4, top_k: "
      "2, "
      "shared_hidden: 16, shared_gate: true}\n",
      "batch: {input: [2, 3, 8]}\nmodules:\n  - {name: m, type: moe, dim: 8, hidden: 12, experts: 8, top_k: "
      "3, "
      "score_func: sigmoid, selection_bias: true, routed_scaling_factor: 2.5, shared_hidden: 12}\n"}},
    {"sequential",
     {"batch: {input: [4, 8]}\nmodules:\n  - {name: s, type: sequential, modules: [{name: a, type: linear, "
      "in: 8, out: 8}]}\n",
      "batch: {input: [4, 8]}\nmodules:\n  - {type: sequential, modules: [{name: a, type: linear, in: 8, "
      "out: 8}]}\n"}},
    {"residual",
     {"batch: {input: [4, 8]}\nmodules:\n  - {name: r, type: residual, modules: [{name: a, type: rms_norm, "
      "dim: 8}]}\n",
      "batch: {input: [4, 8]}\nmodules:\n  - {type: residual, modules: [{name: a, type: linear, in: 8, out: "
      "8}]}\n"}},
    {"repeat",
     {"batch: {input: [4, 8]}\nmodules:\n  - {name: layers, type: repeat, count: 3, modules: [{name: a, "
      "type: linear, in: 8, out: 8}, "
      "{name: n, type: batch_norm, features: 8}]}\n"}},
    {"shared",
     {"batch: {input: [4, 8]}\nmodules:\n  - {name: a, type: linear, in: 8, out: 8}\n  - {name: b, type: "
      "shared, module: a}\n"}},
};

// Restores the default byte limit when a test that changes it ends, however it ends.
struct ByteLimit {
    explicit ByteLimit(int64_t bytes) { set_model_byte_limit(bytes); }
    ~ByteLimit() { set_model_byte_limit(int64_t{8} << 30); }
};

// What a built model holds: its parameters and buffers, each once (tied and shared ones too).
int64_t held_bytes(const Model& m) {
    std::set<const Parameter*> seen;
    int64_t bytes = 0;
    for (const auto& [name, p] : m.state_dict())
        if (seen.insert(p.get()).second) bytes += static_cast<int64_t>(p->value.nbytes());
    return bytes;
}

// Whether a module of `type` is in the tree, transparent containers included.
bool has_type(const Module& m, const ModuleType* type) {
    if (&m.module_type() == type) return true;
    for (const auto& [name, child] : m.children())
        if (has_type(*child, type)) return true;
    return false;
}

}  // namespace

TEST_CASE("module types: each registered type counts, before building, exactly what building it allocates",
          "[cpu]") {
    for (const std::string& type : module_type_names()) {
        INFO("type " << type);
        auto it = kExamples.find(type);
        REQUIRE(it != kExamples.end());  // a registered type needs its examples above
        for (const std::string& text : it->second) {
            INFO(text);
            int64_t held = 0, batch = 0;
            {
                ByteLimit none(0);
                const Model m = load_model_text(text, "m.yaml", "", false);
                int64_t n = 1;
                for (int64_t d : m.input.shape) n *= d;
                batch =
                    n * static_cast<int64_t>(dtype_size(m.dtype));  // the batch counts in the model's dtype
                held = held_bytes(m);
                const ModuleType* t = find_module_type(type);
                CHECK((has_type(*m.root, t) || t->aliases()));  // `shared` builds the earlier module
            }
            ByteLimit exact(batch + held);  // the model fits a limit of exactly what it allocates ...
            CHECK_NOTHROW(load_model_text(text, "m.yaml", "", false));
            ByteLimit one_less(batch + held - 1);  // ... and not one byte less
            require_input_error(
                [&] { load_model_text(text, "m.yaml", "", false); },
                {fmt::format("the model reaches {} bytes of parameters and batch, over the limit of {}",
                             batch + held, batch + held - 1)});
        }
    }
}

TEST_CASE(
    "module types: the registry refuses a second type of one name and lists types in their listed order",
    "[cpu]") {
    class Impostor final : public ModuleType {
    public:
        Impostor() : ModuleType("linear", 1) {}
        std::shared_ptr<Module> build(ModuleBuilder&, ModuleEntry&) const override { return nullptr; }
        TpTemplate tp_template() const override { return {}; }
    };
    static const Impostor impostor;
    const ModuleType* linear = find_module_type("linear");
    REQUIRE(linear != nullptr);
    CHECK_THROWS_WITH(register_module_type(impostor),
                      Catch::Contains("module type 'linear' registered twice"));
    CHECK(find_module_type("linear") == linear);  // the first stays
    CHECK(find_module_type("lienar") == nullptr);
    // the order an unknown type's message offers them in, as the loader listed them before the registry
    CHECK(module_type_names() == std::vector<std::string>{"linear", "relu", "gelu", "silu", "tanh",
                                                          "identity", "layer_norm", "rms_norm", "batch_norm",
                                                          "embedding", "position_embedding", "dropout",
                                                          "attention", "gated_mlp", "moe", "sequential",
                                                          "repeat", "residual", "shared"});
    const std::string head = "batch: {input: [4, 2]}\nmodules:\n";
    require_input_error(
        [&] { load_model_text(head + "  - {name: a, type: selu}\n", "bad.yaml"); },
        {"bad.yaml:3:21: unknown module type 'selu' (did you mean 'relu'?)"});  // relu, gelu, silu tie: the
                                                                                // first listed
    require_input_error([&] { load_model_text(head + "  - {name: a, type: conv2d}\n", "bad.yaml"); },
                        {"unknown module type 'conv2d' (valid: linear, relu, gelu, silu, tanh, identity, "
                         "layer_norm, rms_norm, "
                         "batch_norm, embedding, position_embedding, dropout, attention, gated_mlp, moe, "
                         "sequential, repeat, residual, "
                         "shared)"});
}

TEST_CASE(
    "module types: a rope base whose float32 frequencies overflow is exit 2 at the attention, "
    "one under 1 that does not is accepted",
    "[cpu]") {
    const std::string head = "batch: {input: [2, 4, 8]}\nmodules:\n";
    auto attention = [&](const std::string& theta) {
        return head + "  - {name: a, type: attention, dim: 8, heads: 2, rope_theta: " + theta + "}\n";
    };
    require_input_error([&] { load_model_text(attention("1e-308"), "bad.yaml"); },
                        {"bad.yaml:3:5: rope_theta 1e-308 gives a rotary frequency of inf"});
    // 1e-70: a frequency of 1e35, finite in float32, whose angles overflow past 2^24 positions
    require_input_error([&] { load_model_text(attention("1e-70"), "bad.yaml"); },
                        {"rope_theta 1e-70 gives a rotary frequency of 1e+35"});
    CHECK_NOTHROW(load_model_text(attention("1e-20"), "ok.yaml"));  // 1e10
    CHECK_NOTHROW(load_model_text(attention("0.5"), "ok.yaml"));
    CHECK_NOTHROW(load_model_text(attention("500000"), "ok.yaml"));
    CHECK_NOTHROW(load_model_text(attention("1e300"), "ok.yaml"));  // frequencies of 0: angles of 0
}

TEST_CASE("module types: a module points at its registered type, whose rules the plan writer and shrink read",
          "[cpu]") {
    const Model m = load_model(PTOOL_SOURCE_DIR "/models/llama_rope.yaml");
    std::map<std::string, TpRule> rules;
    for_each_module(*m.root, [&](const std::string&, Module& mod) {
        CHECK(&mod.module_type() == find_module_type(mod.type()));
        rules[mod.type()] = mod.module_type().tp_template().rule;
    });
    CHECK(&m.root->module_type() == find_module_type("sequential"));
    CHECK(rules.at("attention") == TpRule::projections);
    CHECK(rules.at("linear") == TpRule::linear);
    CHECK(rules.at("rms_norm") == TpRule::norm);
    CHECK(rules.at("repeat") == TpRule::repeat);
    CHECK(find_module_type("attention")->tp_template().colwise == ".[qkv]_proj");
    CHECK(find_module_type("gated_mlp")->tp_template().rowwise == ".down_proj");
    CHECK(find_module_type("batch_norm")->tp_template().rule == TpRule::none);
    CHECK(find_module_type("repeat")->shrink_keys().count == "count");
    CHECK(find_module_type("attention")->shrink_keys().heads == "heads");
    CHECK(find_module_type("embedding")->shrink_keys().sizes == std::vector<std::string>{"vocab", "dim"});
    CHECK(find_module_type("position_embedding")->shrink_keys().sizes ==
          std::vector<std::string>{"dim"});  // not its positions
    CHECK(find_module_type("residual")->transparent_without_name());
    CHECK_FALSE(find_module_type("repeat")->transparent_without_name());
    CHECK(find_module_type("shared")->aliases());
}

}  // namespace test_module_types
