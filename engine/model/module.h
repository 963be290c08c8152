// Module: one node of the model tree, with explicit forward and backward (no autograd tape).
//
// Names follow PyTorch: a module's parameters are registered under local names ("weight",
// "bias"), children under theirs ("net1", "0"), and full names join them with dots
// ("layers.0.net1.weight"). A module reached twice (`shared`) or a parameter owned twice
// (`tie:`) is the same object under two names, as in PyTorch: state_dict lists both names,
// named_parameters the first only.
//
// forward() saves what backward() needs per microbatch (model/microbatch_stack.h): a schedule may
// run several microbatches' forwards before their backwards, and a module called twice in one
// microbatch (`shared`) pops its saves in reverse order.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/microbatch_stack.h"
#include "model/placed.h"
#include "model/selective_recompute.h"

namespace ptool {

class RoutingLog;
class Float8Log;

// What verify's reference logs for the parallel runs to follow at their near-ties: each moe call's
// routing (model/routing_log.h), each float8 linear's operands (model/float8_log.h); null: not logged.
struct ReferenceLogs {
    RoutingLog* routing = nullptr;
    Float8Log* float8 = nullptr;
};
class RoutedExperts;
class AttentionCore;
struct Float8Gemms;

// How verify's reference splits an activation's rows into the ranks' local tensors, each of which
// torchao scales apart (model/float8_linear.h): the data ranks' equal blocks of the batch's rows,
// and under context parallelism each cp rank's positions of every sequence (torchtitan's
// context_parallel shards the sequence in place: a linear sees its rank's plain local tensor).
struct Float8RowGroups {
    int data = 1, cp = 1;
    bool load_balance = false;  // cp's head-tail chunks (model/context_shard.h)
    int groups() const { return data * cp; }
};
class BatchStatistics;

struct Parameter {
    Tensor value;
    Tensor grad;  // same shape and dtype (a float8 value's: the compute dtype); zeroed by zero_grad()
    // While value holds float8 codes (uint8), the scale they were cast with: a float8 linear's weight
    // FSDP2 gathered in float8 (parallel/fully_shard.h), or the reference's copy of such a weight
    // (parallel/mixed_precision.h), used by the GEMMs as it is.
    float float8_scale = 0;
};
using ParamPtr = std::shared_ptr<Parameter>;

// What an observer sees: a module's output (forward) or its input gradient (backward).
enum class Phase { forward, backward };
const char* phase_name(Phase p);  // "forward", "backward"

// An event a module reports from inside itself (the context-parallel ring's steps): named
// "FQN#PART", PART saying what it is ("output at ring step 1 of 4"); the reference reports the same
// name where it computes the same values, and localisation reads the two parts apart.
inline std::string sub_event(const std::string& fqn, const std::string& part) {
    return fqn + "#" + part;
}

class Communicator;  // comm/communicator.h
class Module;
class ModuleType;     // model/module_type.h
struct ContextShard;  // model/context_shard.h

// A split backward's deferred parameter-gradient work (RunContext::weight_work): what computes each
// parameter gradient and each hook's post_backward, in the order one backward runs them, and the
// activations that work reads (a linear's input, a norm's input and statistics): what a pending W
// keeps alive from its I, beside the output gradients its closures hold.
struct WeightWork {
    std::vector<std::function<void(struct RunContext&)>> work;
    std::vector<Tensor> reads;
    bool empty() const { return work.empty(); }
};

// Per-step state shared by every module during one forward/backward.
struct RunContext {
    Backend* backend = nullptr;
    uint64_t seed = 0;
    int64_t step = 0;
    bool training = true;
    int64_t row_offset =
        0;  // global row of this rank's first batch row (data parallel): dropout's mask index
    int tp_rank = 0, tp_parts = 1;  // this rank on the tensor-parallel dim: where a shard sits in its tensor
    // Called after each module's forward (output) and backward (input gradient) with its FQN and
    // the microbatch it belongs to, for divergence localisation; may be empty. A module may report
    // events inside itself too, named by sub_event (the ring's steps).
    std::function<void(const std::string& fqn, Phase, int microbatch, const Placed&)> observer;
    // Verification's reference on one device, beside a plan whose cp dim runs the ring: that plan's
    // cp layout (rank_positions; no communicator), so attention reports what each ring step leaves
    // on the plan's ranks (model/modules/attention_ring_probe.cpp). Null elsewhere.
    const ContextShard* ring_probe = nullptr;
    // The tensor-parallel group (null on one device): a moe layer agrees its routing over it
    // (model/moe.h).
    Communicator* tp = nullptr;
    // Expert parallelism: the group a moe layer's experts split over (null without expert_parallel;
    // parallel/expert_parallel.h).
    Communicator* ep = nullptr;
    // Routing-aware verdicts (model/routing_log.h): the reference logs each moe call's routing into
    // it, a parallel run (routing_replays) takes the reference's choice for the near-ties. Null
    // outside verify.
    RoutingLog* routing = nullptr;
    bool routing_replays = false;
    // Near-tie-aware float8 verdicts (model/float8_log.h): the reference logs each float8 linear's
    // operands before their casts into it, a parallel run (float8_replays) casts the reference's
    // value where its own agrees within tolerance. Null outside verify.
    Float8Log* float8_log = nullptr;
    bool float8_replays = false;
    double reference_grad_scale = 1.0;  // a parallel rank's activation gradients times it: the reference's
    // Losses a module adds to the microbatch's (a moe layer's load-balancing loss), summed here
    // unscaled; what the microbatch's loss is multiplied by (1 / the step's microbatches); the group
    // of ranks whose tokens differ (the data dims and cp flattened; null: one), over which such a
    // loss's statistics are summed. Null and 1 outside a Run's step.
    double* aux_loss = nullptr;
    double loss_scale = 1.0;
    Communicator* tokens = nullptr;
    // Whether data parallel (and cp) sum the ranks' gradients rather than average them
    // (loss_normalization global_tokens: FSDP's gradient division off).
    bool grads_summed = false;
    // Activation checkpointing: a checkpointed module's first forward keeps nothing for backward
    // (recording off), and its backward first recomputes its forward (recomputing on).
    bool recording = true, recomputing = false;
    // Inside a region checkpointed under the op-level selective policy (model/selective_recompute.h):
    // the pass's matmul count, which decides which outputs are kept; null elsewhere.
    SelectiveRegion* selective = nullptr;
    // Which microbatch of the step this forward or backward is (train/schedule.h): what a forward
    // saves is popped by the backward of the same microbatch.
    int microbatch = 0;
    // Zero-bubble's split backward (train/schedule.h's I and W actions, torch's stage_backward_input
    // and stage_backward_weight): while set, a backward computes input gradients only and appends
    // here, in the order one backward would run them, what computes each module's parameter
    // gradients and its hooks' post_backward (Module::defer_weights); the W action runs the list
    // (run_weight_work). Null: one backward computes both.
    WeightWork* weight_work = nullptr;
    // Context parallelism: this rank's positions of the sequence and the cp group
    // (model/context_shard.h); null when the whole sequence is here.
    const ContextShard* context = nullptr;
    // Float8 linears (model/float8_linear.h): the ranks whose rows this forward holds, each scaling
    // its own (verify's reference on one device: the plan's data ranks and cp ranks; a rank: its own).
    Float8RowGroups float8_row_groups;
    // The framework tally's (core/framework_memory.h): what PyTorch's loss keeps for its backward
    // (train/framework_loss.h), and what it frees once the first module's backward has run (the
    // loss's gradient of the logits, which the output layer's backward consumes).
    std::vector<Tensor> torch_loss_saved, torch_release_after_first_backward;
};

// Forward/backward hooks around a module, as PyTorch's module pre-/post-forward hooks; the
// tensor-parallel styles are hooks (parallel/style.h). Each *_backward is the adjoint of its
// forward hook. Hooks keep their own saves (a shared module runs them twice per step).
class ModuleHooks {
public:
    virtual ~ModuleHooks() = default;
    virtual Placed pre_forward(RunContext&, Module&, const Placed& x) { return x; }
    virtual Placed post_forward(RunContext&, Module&, const Placed& y) { return y; }
    virtual Placed post_forward_backward(RunContext&, Module&, const Placed& dy) { return dy; }
    virtual Placed pre_forward_backward(RunContext&, Module&, const Placed& dx) { return dx; }
    // The module's backward is done (its parameters' gradients are complete), also when it has no
    // input gradient (embeddings): fully_shard's reduce_scatter.
    virtual void post_backward(RunContext&, Module&) {}
    // Where the hook's sharding changes what the module computes (a colwise linear makes Shard(-1)
    // out of a Replicate input, and a Partial input gradient): those placements, read instead of
    // the module's own rule. nullopt: the module's rule.
    virtual std::optional<Placement> compute_out(const Module&) const { return std::nullopt; }
    virtual std::optional<Placement> compute_grad_in(const Module&) const { return std::nullopt; }
    // torch.autograd.graph.saved_tensors_hooks around the module's forward: for a tensor the module
    // saves for its backward, what brings it back instead of keeping it (an empty function: keep
    // the tensor). Megatron's sequence parallelism keeps a column-parallel linear's input as this
    // rank's sequence shard and all-gathers it again in backward (parallel/styles/colwise.cpp).
    virtual std::function<Tensor()> pack_saved(const Tensor&) { return {}; }
};

// The static counterpart of forward: a container asks the visitor for each child's output layout
// (parallel/layout_pass.h applies the child's style and records the call).
class LayoutVisitor {
public:
    virtual ~LayoutVisitor() = default;
    virtual Layout call(const Module& child, const Layout& in) = 0;
    virtual int parts() const = 0;  // ranks of the tensor-parallel dim
};

// An activation's layout that a module cannot compute on (a sharded last dim into a plain linear,
// sequence shards into attention): exit 2 from the lint, which adds where and how to fix it.
class LayoutError : public InputError {
public:
    using InputError::InputError;
};

// How a container's forward uses its children: in order, each's output the next's input
// (sequence: nn.Sequential, the root), the same plus its input (residual), or in order as copies of
// one block (repeat: nn.ModuleList, what fully_shard, checkpointing, the stages and the planner take
// block by block). none: a leaf, or a block whose forward is its own (attention, gated_mlp).
enum class Chaining : uint8_t { none, sequence, residual, repeat };

class Module {
public:
    Module(const ModuleType& type, std::string name, SourceLocation where)
        : type_(&type), name_(std::move(name)), where_(std::move(where)) {}
    virtual ~Module() = default;

    // The type the YAML's `type:` named (model/module_type.h: its parse, plan-writer and shrink
    // rules); a `shared` entry is the earlier module itself.
    const ModuleType& module_type() const { return *type_; }
    const std::string& type() const;  // its name, for messages
    const std::string& name() const { return name_; }
    const std::string& fqn() const { return fqn_; }
    const SourceLocation& where() const { return where_; }

    // The output shape for an input shape; throws InputError naming this module when they do not fit.
    virtual Shape output_shape(const Shape& in) const { return in; }
    // Input is floating activations except for embedding (integer ids).
    virtual bool takes_ids() const { return false; }
    // Fills this module's own parameters and buffers (not its children's) with PyTorch's default
    // init, drawn from the counter-based RNG keyed by (seed, "init", parameter fqn).
    virtual void init_params(uint64_t /*seed*/) {}
    // Fills `local`, the piece [offset, offset + local.size(dim)) along `dim` of parameter `param`
    // (dim -1: the whole parameter), with exactly the values init_params gives those elements, so a
    // rank builds its shard without the full tensor (src_data_rank: null). Linear and embedding.
    virtual void init_shard(uint64_t seed, const std::string& param, Tensor& local, int64_t dim,
                            int64_t offset) const;
    // transformers' _init_weights (the model's `init` key, model/model.h InitScheme): the module's
    // weight ~ N(0, std) and its bias 0 instead of PyTorch's defaults. Returns whether the module has
    // such a weight (linear, embedding, position_embedding); the others keep their defaults (norms: 1).
    virtual bool set_normal_init(double /*std*/) { return false; }

    // Runs the hooks and the module, and reports the output (input gradient) to ctx.observer.
    Placed forward(RunContext& ctx, const Placed& x);
    Placed backward(RunContext& ctx, const Placed& dy);
    // A backward's parameter-gradient work (a module's, or a hook's that reads the gradients): run
    // now, or appended to ctx.weight_work for the W action with the activations it reads.
    static void defer_weights(RunContext& ctx, std::function<void(RunContext&)> work,
                              std::vector<Tensor> reads = {});

    // Static: the output layout for an input layout; containers route their children through v.
    // Leaves: output_shape and out_placement. Throws LayoutError on a conflict.
    virtual Layout layout(LayoutVisitor& v, const Layout& in) const;
    // Leaves: the output placement for an input layout. Elementwise modules keep it.
    virtual Placement out_placement(const Layout& in) const { return in.p; }

    struct Entry {
        std::string name;
        ParamPtr param;
    };
    const std::vector<Entry>& params() const { return params_; }
    const std::vector<Entry>& buffers() const { return buffers_; }
    const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

    void set_fqn(const std::string& fqn) { fqn_ = fqn; }
    // An unnamed residual or sequential: its children's names join its parent's, it is not one of
    // named_modules() (for_each_module passes it over, so no plan pattern matches it), and it
    // reports no events of its own (its fqn is its parent's).
    void set_transparent() { transparent_ = true; }
    bool transparent() const { return transparent_; }
    // Activation checkpointing (torch.utils.checkpoint): the module keeps only its input in forward
    // and recomputes its forward (hooks and collectives included, not observed) in backward.
    void set_checkpointed(bool on) { checkpointed_ = on; }
    bool checkpointed() const { return checkpointed_; }
    // Selective checkpointing at op level (torchtitan's policy, model/selective_recompute.h): a
    // checkpointed module whose region keeps some ops' outputs and recomputes the rest.
    void set_selective(bool on) { selective_ = on; }
    bool selective() const { return selective_; }
    // The outputs this op keeps under the op policy (linear, flash attention; null for the rest).
    virtual KeptOutputs* kept_outputs() { return nullptr; }
    // Its experts and their routing, where it routes tokens to experts (model/routed_experts.h; null
    // for the rest).
    virtual RoutedExperts* routed_experts() { return nullptr; }
    const RoutedExperts* routed_experts() const { return const_cast<Module*>(this)->routed_experts(); }
    // What the rest of ptool asks a module for instead of casting it to a concrete type (as
    // routed_experts): a new module type that offers one of these is treated as the ones that do.
    // Its scaled-dot-product core, where it attends over the sequence (model/attention_core.h).
    virtual AttentionCore* attention_core() { return nullptr; }
    const AttentionCore* attention_core() const { return const_cast<Module*>(this)->attention_core(); }
    // Its running batch statistics, where it normalises over the batch (model/batch_statistics.h).
    virtual BatchStatistics* batch_statistics() { return nullptr; }
    const BatchStatistics* batch_statistics() const { return const_cast<Module*>(this)->batch_statistics(); }
    // How a container runs its children (Chaining); none for a leaf or a block with its own forward.
    virtual Chaining chaining() const { return Chaining::none; }
    // The rows the ids it looks up index (an embedding's vocabulary); 0 where it takes no ids.
    virtual int64_t id_rows() const { return 0; }
    // Where it zeroes activations at random (dropout): the probability; nullopt elsewhere.
    virtual std::optional<double> drop_probability() const { return std::nullopt; }
    // A linear's GEMM: its in and out features (nullopt for the rest); what float8 conversion
    // selects by (parallel/float8_training.h).
    virtual std::optional<std::pair<int64_t, int64_t>> linear_features() const { return std::nullopt; }
    // torchao's Float8Linear (model/float8_linear.h): a module with linear_features runs its GEMMs
    // so from now on; float8(): what it runs now (null: its own dtype).
    virtual void set_float8(const Float8Gemms&) {
        PTOOL_REQUIRE(false, "float8 on '{}', not a linear", fqn_);
    }
    virtual const Float8Gemms* float8() const { return nullptr; }
    void register_param(const std::string& name, ParamPtr p) { params_.push_back({name, std::move(p)}); }
    void register_buffer(const std::string& name, ParamPtr b) { buffers_.push_back({name, std::move(b)}); }
    void add_child(const std::string& name, std::shared_ptr<Module> m) {
        children_.push_back({name, std::move(m)});
    }
    // Drops the children keep() refuses (a pipeline stage keeps its own layers: train/stage.h).
    void keep_children(const std::function<bool(Module&)>& keep);
    ParamPtr param(const std::string& name) const;  // nullptr when absent

    void set_hooks(std::shared_ptr<ModuleHooks> hooks) { hooks_ = std::move(hooks); }
    // Wraps the hooks the module has (tensor parallel's) in outer ones (fully_shard's): the outer
    // pre_forward runs first and its post_forward last, and their adjoints the other way round.
    void add_outer_hooks(std::shared_ptr<ModuleHooks> outer);
    const std::shared_ptr<ModuleHooks>& hooks() const { return hooks_; }

protected:
    // Leaves compute on local tensors; the placements follow from the layout rules.
    virtual Tensor forward_impl(RunContext& ctx, const Tensor& x);
    virtual Tensor backward_impl(RunContext& ctx, const Tensor& dy);
    // Containers hand Placed values to their children; the default wraps forward_impl/backward_impl.
    // `in` is this call's input layout (its gradient has the same placement, Partial -> Replicate).
    virtual Placed forward_placed(RunContext& ctx, const Placed& x);
    virtual Placed backward_placed(RunContext& ctx, const Placed& dy, const Layout& in);
    // Throws LayoutError naming this module.
    [[noreturn]] void conflict(const std::string& message) const;
    [[noreturn]] void fail(const std::string& message) const { throw InputError(where_, message); }

    // What the forward keeps for the backward (through the hooks' pack_saved), and gets back.
    void save(std::vector<Tensor> tensors);
    std::vector<Tensor> restore();

private:
    const ModuleType* type_;
    std::string name_, fqn_;
    SourceLocation where_;
    std::vector<Entry> params_, buffers_;
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
    struct Saved {
        Tensor tensor;                   // kept as it is, or
        std::function<Tensor()> unpack;  // what a pack_saved hook kept instead
    };
    MicrobatchStack<std::vector<Saved>> saved_;
    MicrobatchStack<Layout> inputs_;  // per call: the input layout (after the pre-forward hook)
    bool checkpointed_ = false, selective_ = false, saving_ = true, transparent_ = false;
    int microbatch_ = 0;  // of the forward or backward running now (save and restore key on it)
    struct CheckpointedCall {
        Placed input;
        uint64_t selective_call;  // its op-policy region's (SelectiveRegion::call)
    };
    MicrobatchStack<CheckpointedCall> checkpoint_inputs_;     // per checkpointed call
    Placed forward_hooked(RunContext& ctx, const Placed& x);  // hooks + the module, no checkpointing
    std::shared_ptr<ModuleHooks> hooks_;
};

// The W action: runs the parameter-gradient work a split backward appended, in order, as
// microbatch ctx.microbatch's (and empties the list).
void run_weight_work(RunContext& ctx, WeightWork& work);

// Walks the tree in registration order: fn(full_name, parameter). Shared objects appear under every name.
void for_each_param(const Module& root, const std::function<void(const std::string&, const ParamPtr&)>& fn,
                    bool buffers = false);
// Every module in forward registration order, first name only: fn(fqn, module). Transparent
// containers are passed over (their children are visited).
void for_each_module(const Module& root, const std::function<void(const std::string&, Module&)>& fn);
// Every module once with its name, in for_each_module's order (a plan's patterns are matched
// against the list, not a walk of the tree per pattern).
std::vector<std::pair<std::string, Module*>> named_modules(const Module& root);
// The modules under `root`, itself included, each child counted where it is listed (a `shared`
// module under each name): what building, the layout pass and a simulation walk.
int64_t modules_under(const Module& root);

// Allocates a parameter and its gradient, uninitialised (see module.cpp).
ParamPtr make_param(Shape shape, DType dtype);
ParamPtr make_buffer(Shape shape, DType dtype);  // no gradient

Tensor empty_like(const Tensor& t);  // uninitialised: for outputs a kernel overwrites
std::string join_name(const std::string& prefix, const std::string& name);

}  // namespace ptool
