// Run: the one training loop. A Run is one rank's model, laid out on a mesh as a plan says, and
// steps it as a PyTorch loop does: zero_grad, forward, loss, backward, the data-parallel gradient
// sync, optimizer.step(). The single-device reference is the same Run on a one-rank mesh with no
// plan (every redistribution is then a no-op). `ptool run`, `golden record`, verify's reference
// and parallel runs, and the benches all step a Run; verify/recorder.h records what it leaves.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "core/safetensors.h"
#include "model/batch.h"
#include "model/context_shard.h"
#include "model/loss.h"
#include "model/optimizer.h"
#include "parallel/mixed_precision.h"
#include "parallel/parallelize.h"
#include "train/schedule.h"
#include "train/stage.h"

namespace ptool {

struct RunInputs {
    std::string model_path, model_text, dtype_override;
    // model_text's document, parsed, where the caller holds it (the planner's variants of a model:
    // plan/shrink.h ModelVariants): built from, model_text not read
    const YamlNode* model_document = nullptr;
    const TensorFile* init = nullptr;  // --init: a state_dict
    std::string init_path;
    const TensorFile* data = nullptr;  // --data
    std::string data_path;
    // Where the ranks compute. cuda: rank threads on one GPU (cuda_local) or one per GPU (nccl);
    // models are built on the host and moved.
    Device device = Device::cpu;
};

// The plan of the single-device reference: a one-rank mesh, nothing parallel.
Plan single_device_plan();
// The reference of `plan`: single_device_plan() computing as the plan does (its mixed precision and
// its microbatches: a pipeline's per round, the plan's gradient_accumulation rounds; what it lays out
// where is the plan's own business).
Plan reference_plan(const Plan& plan);

// A fault layer's change to a split backward's W (RunLayer::weight_fault): none; skipped (its work
// runs, its gradients' change is undone); doubled (its gradients' change added twice, as a rank
// holding two stages of a V that accumulates a chunk's W into both); freed_input (the activations
// its work reads are freed memory by then: read as zeros, restored after).
enum class WeightFault { none, skipped, doubled, freed_input };

// A layer that wraps parts of a run from outside; every default leaves the run as it is.
// Fault injection (verify/faults.h) is one: it wraps communicators and hooks to break them.
class RunLayer {
public:
    virtual ~RunLayer() = default;
    // Whether the layer needs every parameter built whole (src_data_rank: null then broadcasts nothing
    // but each rank still draws its own shard from the full tensor).
    virtual bool needs_full_parameters() const { return false; }
    virtual void wrap_mesh(DeviceMesh&, const Plan&) {}
    // A pipeline rank's stages once it keeps only its own, before the parameters are distributed:
    // each stage's index and its spine modules in order (one stage; virtual_stages of them under
    // interleaved_1f1b, stage s on pp rank s mod pp). Not called without a pipeline.
    virtual void held_stages(const std::vector<std::pair<int, std::vector<Module*>>>& /*stages*/) {}
    // Before the styles distribute the parameters (they are whole here).
    virtual void before_parallelize(const Model&, const Resolution&) {}
    // After the styles are installed: parameters and hooks as parallelize left them.
    virtual void after_parallelize(Model&, const Plan&, const Resolution&, const TpParams&, DeviceMesh&) {}
    // The data-parallel resolution the run executes (the one it is judged by is the plan's).
    virtual DataParallelResolution data_parallel(const DataParallelResolution& r) { return r; }
    // The expert-parallel resolution the run executes.
    virtual ExpertParallelResolution expert_parallel(const ExpertParallelResolution& r) { return r; }
    // After a step's backward, before the gradients are synchronised across dp ranks.
    virtual void before_gradient_sync(Model&, Communicator& /*world*/) {}
    // After the optimizer step (and torchtitan's post-optimizer hooks), the parameters as it left them.
    virtual void after_optimizer_step(Model&) {}
    // What a microbatch's loss is multiplied by, given the run's factor (1 / the step's microbatches;
    // under global_tokens 1 for the summed loss, whose divisor is the step's count) and the step's
    // microbatches.
    virtual double loss_scale(double scale, int64_t /*microbatches*/) { return scale; }
    // The loss normalisation the run executes, given the plan's (the one it is judged by).
    virtual LossNormalization loss_normalization(LossNormalization n) { return n; }
    // Before microbatch m's backward on stage s, or its W under a split backward (where its
    // gradients accumulate into the stage's).
    virtual void before_backward(Model&, int /*stage*/, int /*microbatch*/) {}
    // The action lists the run executes, given the checked schedule (Run checks them again).
    virtual void schedule(Schedule&) {}
    // What becomes of stage s's W of microbatch m (a split backward's; WeightFault).
    virtual WeightFault weight_fault(int /*stage*/, int /*microbatch*/) { return WeightFault::none; }
    // The norm clip_grad_norm clips by (and returns), given the gradients' total norm and the step's
    // microbatch count.
    virtual double clip_norm(double norm, int64_t /*microbatches*/) { return norm; }
    // A group the run splits from the world outside the mesh's dims, its counter set: the stages that
    // hold weight `param` tied across them.
    virtual std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> c,
                                                     const std::string& /*param*/) {
        return c;
    }
};

using StepObserver = std::function<void(const std::string& fqn, Phase, int microbatch, const Placed&)>;
// Sees each of a rank's schedule actions run: before (done false) and after (done true) a forward,
// a backward, the sync, clip or step, or a batch of consecutive sends and receives (every action of
// the batch at once). The simulator measures each action's work with it (train/simulate.h).
using ActionObserver = std::function<void(const std::vector<Action>&, bool done)>;

struct StepOutput {
    // per microbatch, as the loss saw it: gathered (Replicate on tp), or sharded under loss_parallel;
    // this dp rank's rows of it
    std::vector<Placed> outputs;
    // over this dp rank's rows: the microbatches' losses, each divided by their count (global_tokens:
    // each its sum over the valid targets divided by the step's count over every rank)
    double loss = 0;
    // the part of `loss` the modules added (moe balancing losses), the same on every rank whose tokens
    // differ: a combination of the ranks' losses that sums their parts (global_tokens) takes it once
    double aux_loss = 0;
    double grad_norm =
        0;  // clip_grad_norm: the gradients' total norm before clipping (clip_grad_norm_'s return)
    double seconds = 0;  // forward + backward + gradient sync + optimizer, synchronised
    double started = 0;  // when this rank's step began (steady clock, seconds): ranks of one process compare
};

class Run {
public:
    // Builds the model on this rank (of `world`, whose size is the plan's world size), the mesh,
    // the tensor-parallel styles and data parallelism. Collective over `world`. `resolved`: the plan
    // already resolved against another model of in.model_text (verify's lint, explain's), which the
    // run rebinds to its own model (Resolution::rebound) instead of resolving the plan again; its
    // plan must be `plan` itself.
    Run(const RunInputs& in, const Plan& plan, Communicator& world, RunLayer* layer = nullptr,
        const ResolvedPlan* resolved = nullptr);
    // The run keeps a reference to its plan (its resolution points into it): a temporary would dangle.
    Run(const RunInputs& in, Plan&& plan, Communicator& world, RunLayer* layer = nullptr,
        const ResolvedPlan* resolved = nullptr) = delete;
    ~Run();

    // One training step on step k's batch: plan().accumulation_rounds(model()) rounds of the plan's
    // microbatches_per_round() microbatches (each divided over the dp ranks), then the gradient
    // sync, clipping and the optimizer step. `observer` sees every module's output and input gradient.
    StepOutput step(int64_t k, const StepObserver& observer = nullptr);

    const Model& model() const { return model_; }
    const Plan& plan() const { return plan_; }
    const ParallelDims& dims() const { return plan_.dims; }
    const Resolution& resolution() const { return res_; }
    Backend& backend() const { return be_; }
    CommCounter& counter() const { return *counter_; }
    Communicator& world() const { return world_; }
    // Mesh dim d's group (this rank and those that differ from it in coordinate d only).
    Communicator& comm(int mesh_dim) const { return mesh_->comm(mesh_dim); }
    // The group of a role's dim; a one-rank group when the plan has no such dim.
    Communicator& comm(DimRole role) const;
    // The group a placement's cut runs over (Placements::Cut): one mesh dim's, or the combined
    // group over several flattened (fully_shard's dp_shard_cp: its dims in that order).
    Communicator& comm(const std::vector<int>& mesh_dims) const;
    // The group the batch's rows are split over: the data dims flattened (one rank without them).
    Communicator& data_comm() const { return *batch_; }
    // What brings this rank's activation gradients to the reference's (verification's): under data
    // (and context) parallel a mean loss over each rank's rows (positions) makes them data x cp
    // times the reference's (DDP's average puts the parameter gradients right); under global_tokens
    // every rank divides by the step's count as the reference does, and a summed loss is a sum.
    double activation_grad_scale() const;
    // Context parallel: this rank's positions of the current step's sequence (null without cp).
    const ContextShard* context() const { return context_ ? &*context_ : nullptr; }
    // Verification's reference beside a plan whose cp dim of `parts` ranks runs the ring: each step
    // the plan's cp layout of the sequence reaches attention as RunContext::ring_probe.
    void probe_ring(int parts, bool load_balance) { probe_parts_ = parts, probe_balance_ = load_balance; }
    // Verification at near-ties: the reference logs its moe routing (model/routing_log.h) and its
    // float8 operands (model/float8_log.h) into `logs`, a parallel run (replay) follows them there.
    void follow_reference(const ReferenceLogs& logs, bool replay) { logs_ = logs, replays_ = replay; }
    // Every rank of this rank's pipeline stage (the mesh's dims but pp, flattened in mesh order):
    // the world without pp. Uncounted use only (verification's).
    Communicator& stage_comm() const { return *stage_comm_; }
    const std::vector<MeshDim>& stage_dims() const { return stage_dims_; }  // its dims, in mesh order
    const DataParallel* data_parallel() const { return data_parallel_.get(); }
    const ExpertParallel* expert_parallel() const { return expert_parallel_.get(); }
    // ZeRO's sharded optimizer (data_parallel's zero_stage 1 or 2), or null.
    ZeroOptimizer* zero() const;
    // ZeRO-2 keeps a shard of each gradient after the step: verification's all_gather of the shards
    // back into every parameter's full gradient, so that it can be recorded (collective over the dp
    // ranks; nothing otherwise).
    void gather_sharded_gradients();
    // A parameter's placement on every mesh dim (the tp style's, then fully_shard's of its tp piece;
    // under fully_shard over dp_shard x cp, cp joined to the shard dim: one cut over the two flattened).
    Placements placements(const Parameter* p) const;
    // A weight tied across pipeline stages held by a later stage than the first that holds it (the
    // lm_head of an embedding tied to it): a copy, kept equal to the first's, that verification
    // records and the gradient norm counts on the first stage only.
    bool shared_copy(const Parameter* p) const;
    // This rank's (first) pipeline stage: its pp rank (0 without pp). Under interleaved_1f1b a rank
    // holds held_stages(): stage(), stage() + pp, ...
    int stage() const { return stage_; }
    int stages() const { return stages_; }
    std::vector<int> held_stages() const;
    bool holds_last_stage() const { return held_.empty() ? stages_ == 1 : held_.back().index + 1 == stages_; }
    // The whole model's state_dict names in order, when this rank's stages are not consecutive
    // (interleaved_1f1b; empty otherwise): verification lists the stages' state in this order.
    const std::vector<std::string>& model_state_names() const { return model_state_names_; }
    bool ignored(const std::string& param) const { return res_.dp.ignored_params.count(param) > 0; }

    const Schedule& schedule() const { return schedule_; }
    // Runs the steps by another schedule of this rank's stages and microbatches (checked first):
    // a one-stage GPipe order runs every forward before the backwards.
    void set_schedule(Schedule s);
    void set_action_observer(ActionObserver o) { action_observer_ = std::move(o); }

private:
    // A microbatch between its forward and its backward: its context, what the forward made (the
    // input as computed on, the output, the loss and its gradient placed as the output was).
    struct Inflight {
        RunContext ctx;
        Tensor in;
        Placed x, y, output, dy;
        LossResult loss;
        Tensor grad;
        double loss_value = 0;
        double aux = 0;  // losses the modules added (a moe layer's balancing loss), unscaled
        double aux_scaled = 0;
    };
    struct Done {
        Placed output;  // as the loss saw it
        double loss = 0;
        double aux = 0;  // the part of loss the modules added, scaled
    };
    // One step's state as its schedule runs: the batch, the microbatches in flight and done.
    struct StepState {
        int64_t step = 0;
        StepObserver observer;
        Batch batch;
        int64_t microbatches = 1, rows = 0, mine = 0;
        // loss_normalization global_tokens: the step's items (valid targets) over every rank whose
        // tokens differ and every microbatch, which each microbatch's summed loss is divided by
        std::optional<double> items;
        // keyed by (stage, microbatch): a rank may hold several stages (interleaved_1f1b)
        std::map<std::pair<int, int>, Inflight> inflight;
        std::map<int, Done> done;  // the last stage's, by microbatch
        // the balancing losses of the stages before the last that this rank holds, scaled as the
        // loss is (each microbatch's / their count): the step's loss adds them (Run::step)
        double aux_before_last = 0;
        // a pipeline stage's: its inputs received (or handed on by the stage before on this rank),
        // its outputs' gradients received (or handed back), its inputs' gradients to send back
        std::map<std::pair<int, int>, Placed> received, received_grads, to_send_back;
        // zero_bubble: a microbatch's W (keyed by stage, microbatch) after its I: the backward's
        // context and the parameter-gradient work its I appended (model/module.h weight_work), or
        // `whole` for the first stage, whose I does nothing and W the whole backward (torch's)
        struct PendingWeights {
            RunContext ctx;
            WeightWork work;
            bool whole = false;
        };
        std::map<std::pair<int, int>, PendingWeights> pending_weights;
        // the framework tally's (core/framework_memory.h) model output of the latest microbatch,
        // held to the step's end as a loop that keeps the model's return value does (`out =
        // model(...); out.loss.backward(); opt.step()`): a meta stand-in, no bytes
        Tensor torch_output;
        // the pipeline's: the last stage's output of every microbatch, as torch.distributed.pipelining's
        // stage keeps them (`output_chunks`) to the next step, in the compute dtype; stand-ins where
        // ptool's own kept outputs are copies in the model's dtype (mixed precision), which the tally
        // does not count
        std::vector<Tensor> torch_stage_outputs;
    };
    struct Held;
    const Held& held(int stage) const;
    void forward(StepState& st, int s, int m);
    // One backward (B), or its input-gradient half (I: `input_only`), the W then by backward_weight.
    void backward(StepState& st, int s, int m, bool input_only = false);
    void backward_weight(StepState& st, int s, int m);
    static void drop_torch_output(StepState& st);
    void exchange(StepState& st, const std::vector<Action>& actions);
    // This rank's first row of microbatch m in the step's batch.
    int64_t first_row(const StepState& st, int m) const;
    // This rank's rows (and cp positions) of microbatch m's target.
    Tensor microbatch_target(const StepState& st, int m) const;
    // torchtitan's global_valid_tokens: this rank's loss items over the step's microbatches, summed
    // over the ranks whose tokens differ (one all_reduce).
    double global_items(const StepState& st);
    // Run::Run's steps, in the order it takes them (train/run.cpp; the pipeline's in run_stage.cpp)
    void load_data(const RunInputs& in);
    bool resolve_loss();
    void build_groups(bool counts_tokens);
    void resolve(const ResolvedPlan* resolved);
    void keep_own_stage();
    void apply_checkpointing();
    void apply_float8();
    void init_params(const RunInputs& in);
    void apply_tensor_parallel(const RunInputs& in);
    void apply_expert_parallel();
    void broadcast_tied_weights();
    void apply_data_parallel();
    void mark_root_hooks();
    void apply_mixed_precision();
    void build_schedule();
    void tie_across_stages(const std::vector<Module*>& spine, const std::vector<StageRange>& ranges,
                           const std::vector<int>& placed);  // placed: each stage's pp rank
    void sync_tied_gradients();
    double clip_gradients(const std::vector<std::pair<std::string, ParamPtr>>& params);
    // How the cp ranks' gradients combine: summed for a sum loss and under global_tokens, else
    // averaged (each rank's loss a mean over its own positions).
    ReduceOp cp_reduce() const;

    Model model_;
    const Plan& plan_;
    Communicator& world_;
    Backend& be_;
    std::unique_ptr<DataSource> data_;
    std::shared_ptr<CommCounter> counter_;
    std::unique_ptr<DeviceMesh> mesh_;
    Resolution res_;
    TpParams tp_params_;
    bool aux_losses_ = false;  // a moe layer of the whole model adds a balancing loss
    // the plan's, else the model's, as the layer lets it run
    LossNormalization normalization_ = LossNormalization::mean_per_call;
    DataParallelResolution executed_dp_;  // what the layer let run (res_.dp: what the plan says)
    std::unique_ptr<DataParallel> data_parallel_;
    std::unique_ptr<ExpertParallel> expert_parallel_;
    ReferenceLogs logs_;
    // the ranks whose tokens differ (data dims and cp): a moe layer's balancing loss sums over them,
    // and global_tokens counts the step's items over them
    Communicator* tokens_ = nullptr;
    bool replays_ = false;
    std::unique_ptr<Communicator> solo_;  // the one-rank group of a role the plan does not have
    Communicator* tp_ = nullptr;          // comm(DimRole::tp): the activations' layouts are on it
    Communicator* batch_ = nullptr;
    Communicator* cp_ = nullptr;  // comm(DimRole::cp): the sequence's group
    // context parallel: this rank's positions of the step's sequence (nullopt without cp)
    std::optional<ContextShard> context_;
    int probe_parts_ = 1;  // probe_ring's
    bool probe_balance_ = false;
    std::optional<ContextShard> ring_probe_;           // the step's, from probe_ring (no communicator)
    std::unique_ptr<MixedPrecision> mixed_precision_;  // the plan's policy, where it casts anything
    std::unique_ptr<Optimizer> optimizer_;
    Device device_;
    RunLayer* layer_ = nullptr;
    Schedule schedule_;
    ActionObserver action_observer_;
    // Pipeline parallel: this rank's stages of `stages_` (one, or virtual_stages under
    // interleaved_1f1b), each with the spine modules it runs and the layouts at its boundaries
    // (without pp: stage 0 of 1, none held, the root runs whole).
    int stage_ = 0, stages_ = 1;
    Communicator* stage_comm_ = nullptr;
    std::vector<MeshDim> stage_dims_;
    struct Held {
        int index = 0;
        std::vector<Module*> modules;
        Layout in, out;
        bool root_hooks = false;  // the root's (fully_shard unit's) hooks run around the stage
    };
    std::vector<Held> held_;  // in increasing stage order
    void check_scatter_gather(const Held& h, int stage) const;
    // each parameter's index in the whole model's parameter order: clip_gradients sums the stages'
    // squares in it when a rank's stages are not consecutive (interleaved_1f1b)
    std::map<const Parameter*, int64_t> param_order_;
    std::vector<std::string> model_state_names_;
    // Weights tied across stages this rank holds (Megatron's embedding group): the group of the pp
    // ranks whose stages hold it (the same coordinates on every other dim), whose first stage's
    // values the others start from and over which the gradients are summed after the data-parallel
    // sync. Uses on two stages of one rank share its one parameter and need no group.
    struct Tied {
        ParamPtr param;
        Communicator* group = nullptr;
        bool copy = false;  // held by an earlier stage too
    };
    std::vector<Tied> tied_;
    std::vector<std::unique_ptr<Communicator>> tied_groups_;
};

}  // namespace ptool
