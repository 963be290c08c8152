// A module type: what a model YAML's `type:` names (linear, rms_norm, attention, repeat, ...). Each
// type is one object, defined and registered (PTOOL_REGISTER_MODULE_TYPE) in the file under
// model/modules/ that implements its module, as the tensor-parallel styles are (parallel/style.h).
// It owns everything about itself that is not the module's own compute:
//   - its parse rule (build): the YAML keys, their defaults and validation (errors at the key's
//     file:line:column), and its parameter count, given to the loader's byte accounting before
//     anything is allocated (ModuleBuilder::account; a test checks it is what building allocates);
//   - how the loader treats its name (transparent without one; `shared`: a second name);
//   - its rule in the tensor-parallel template `ptool plan` writes (tp_template);
//   - which keys `ptool shrink` scales in a proxy of the model (shrink_keys).
// A module points at its type (Module::module_type()); nothing compares type names. Meta
// execution needs nothing here: a module that must not read values on meta tensors says so in its
// own forward (Dropout::mask, BatchNorm's host bookkeeping). docs/adding_a_module.md walks through
// adding one.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/model_limits.h"
#include "core/yaml_reader.h"

namespace ptool {

class Module;

// What a type's parse rule may ask of the loader (model/model_loader.cpp) while it builds a module.
class ModuleBuilder {
public:
    virtual ~ModuleBuilder() = default;
    virtual DType dtype() const = 0;  // the model's
    // Counts `elements` of `dtype` that building is about to allocate against the model's byte
    // limit: exit 2 at `where` when the model passes it.
    virtual void account(const YamlNode& where, int64_t elements, DType dtype) = 0;
    void account(const YamlNode& where, int64_t elements) { account(where, elements, dtype()); }
    // The module an earlier one was built as under `fqn` (`tie`, `shared`): exit 2 at `where`,
    // naming `key`, when there is none.
    virtual std::shared_ptr<Module> lookup(const YamlNode& where, const std::string& fqn,
                                           const char* key) = 0;
    // Builds `m`'s 'modules' list into `parent`'s children (names unique in their scope), under `prefix`.
    virtual void children(YamlMap& m, Module& parent, const std::string& prefix) = 0;
    // Makes a module that no YAML entry names reachable by `fqn` for later `tie` and `shared` (repeat's
    // blocks).
    virtual void name_module(const std::string& fqn, std::shared_ptr<Module> m) = 0;
};

// The module's YAML entry as its type's build reads it ('name' and 'type' are read already;
// keys nobody reads are exit 2 after build).
struct ModuleEntry {
    YamlMap& keys;
    const std::string& name;  // "" for a transparent container
    const std::string& fqn;
    const SourceLocation& where;  // the entry's

    int64_t positive(const char* key) const;  // a required size: 0 < v <= 2^40
};

// Sizes multiplied and added with a check: exit 2 at `where` when they leave int64.
int64_t size_mul(const YamlNode& where, int64_t a, int64_t b);
int64_t size_add(const YamlNode& where, int64_t a, int64_t b);

// (The fields below default to {} so that a type can name only the ones it uses:
// `{.rule = TpRule::norm}`, `{.sizes = {"dim"}}`.)
//
// What plan/plan_writer.cpp does with a module of this type when it writes a Megatron-style
// tensor-parallel plan. plan/ sits above model/, so a type names its rule here and the writer
// implements each rule once; a new type that behaves as an existing one needs no writer change.
enum class TpRule {
    none,         // no tensor-parallel rule: the writer plans no tensor parallelism for the model
    sequence,     // a container: its children in order
    repeat,       // blocks that are copies of one: the first block's entries, its index `*`
    residual,     // its body in order, ending in the layout it started from (the sum needs one)
    elementwise,  // keeps the activation's layout
    norm,         // needs whole features; sequence_parallel where the activation is sequence shards
    whole,        // needs whole sequences and features: the model gets no sequence parallelism
    embedding,    // vocabulary-parallel (rowwise); on a token input, where sequence parallelism starts
    linear,       // Megatron pairs (colwise, then rowwise); the last module with parameters is the head
    projections,  // a block of its own linears: `colwise` ones in, the `rowwise` one out
    experts,      // a mixture of experts: each expert (and the shared one) as `projections`, on whole
                  // tokens (under sequence parallelism the block gathers its input and re-shards its
                  // output: every tp rank routes the same tokens)
};
struct TpTemplate {
    TpRule rule = TpRule::none;
    std::string colwise = {},
                rowwise = {};  // projections: the children's patterns (".[qkv]_proj", ".o_proj")
};

// What `ptool shrink` (plan/shrink.cpp) changes in an entry of this type to make a proxy model.
struct ShrinkKeys {
    // Sizes: every size of the model maps to a small one, in the same order, that splits as the
    // plan splits it.
    std::vector<std::string> sizes = {};
    std::string count = {};  // a count of blocks: at most 2 in the proxy (and what plan extrapolates over)
    // Attention heads: kv_heads becomes tp (when tp divides it), heads keeps its ratio to them,
    // and `heads_of` (a key of `sizes`) stays a multiple of heads x 8.
    std::string heads = {}, kv_heads = {}, heads_of = {};
};

class ModuleType {
public:
    // name: the YAML spelling; listed: its place in the list of types an unknown type's message
    // offers, and so which of equally close names "did you mean" picks (leaves, norms, embeddings,
    // blocks, containers, in steps of 10: the order the loader has always listed them in).
    ModuleType(std::string name, int listed) : name_(std::move(name)), listed_(listed) {}
    virtual ~ModuleType() = default;
    const std::string& name() const { return name_; }
    int listed() const { return listed_; }

    // Reads and checks the entry's keys, accounts the parameters and buffers the module will hold
    // (b.account, before allocating them) and builds it. `shared` returns an earlier module.
    virtual std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const = 0;
    // Written without a name, the container is transparent (residual, sequential; model_format.md).
    virtual bool transparent_without_name() const { return false; }
    // `shared`: build returns an earlier module, which keeps its first name.
    virtual bool aliases() const { return false; }
    virtual TpTemplate tp_template() const = 0;
    virtual ShrinkKeys shrink_keys() const { return {}; }

private:
    std::string name_;
    int listed_;
};

// The registry: every type's file registers its object at start-up (PTOOL_REGISTER_MODULE_TYPE);
// the object lives as long as the program (modules point at it).
const ModuleType* find_module_type(std::string_view name);
std::vector<std::string> module_type_names();  // in their listed order
// Refuses (an internal error) a second type of the same name.
bool register_module_type(const ModuleType& type);
#define PTOOL_REGISTER_MODULE_TYPE(object) \
    static const bool ptool_module_type_registered_##object = ::ptool::register_module_type(object)

}  // namespace ptool
