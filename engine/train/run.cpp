#include "train/run.h"

#include <chrono>
#include <optional>
#include <set>

#include "core/framework_memory.h"
#include "core/tensor_ops.h"
#include "model/attention_core.h"
#include "model/loss.h"
#include "model/routed_experts.h"
#include "parallel/context_parallel.h"
#include "parallel/grad_norm.h"
#include "parallel/loss_parallel.h"
#include "parallel/redistribute.h"
#include "train/framework_loss.h"
#include "train/stage.h"

namespace ptool {
namespace {

// Whether the run's parameters live on its GPU from the start, drawn there (Backend::draw_init) or
// loaded there from --init: one rank without tensor parallelism or a fault layer (`ptool run`,
// verify's reference), where nothing between construction and Model::to_device reads them on the
// host. Other runs build, draw and distribute on the host, then move.
bool builds_on_device(const RunInputs& in, const Plan& plan, const RunLayer* layer) {
    return in.device == Device::cuda && plan.world_size() == 1 && plan.tp_plan.empty() && !layer;
}

// The model's structure; its values from --init, else drawn by the Run once the mesh exists.
Model build_model(const RunInputs& in, bool on_device) {
    auto load = [&] {
        return in.model_document
                   ? load_model_document(*in.model_document, in.model_path, in.dtype_override, false)
                   : load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    };
    if (in.device == Device::meta) {  // shapes only: nothing initialised, nothing allocated
        MetaAllocation meta;
        return load();
    }
    Model m = load();
    if (on_device) m.allocate_on(in.device);
    if (in.init) load_state_dict(m, *in.init, in.init_path);
    return m;
}

// Who draws the styled modules' initial values, when nothing else needs the full parameters
// (no --init, no fault layer that cuts shards from full tensors): with src_data_rank null every
// rank draws only its own pieces from the counter-based RNG; with src_data_rank k only rank k of
// the tp dim draws them, whole, and broadcasts them (parallelize), so the other ranks neither
// draw nor hold a full copy of the model (each receives one parameter at a time).
bool draws_lazily(const RunInputs& in, const Plan& plan, const RunLayer* layer) {
    return plan.dims.has(DimRole::tp) && !in.init && !(layer && layer->needs_full_parameters()) &&
           in.device != Device::meta;
}

bool builds_own_shards(const RunInputs& in, const Plan& plan, const RunLayer* layer) {
    return draws_lazily(in, plan, layer) && !plan.src_data_rank;
}

// Whether the run draws its initial values itself (after the mesh exists, so that it can leave
// out what it receives), not --init's and not on meta.
bool draws_init(const RunInputs& in) {
    return !in.init && in.device != Device::meta;
}

// What a dp rank other than 0 receives from DDP's construction broadcast (construction_broadcast):
// it need not draw a module whose every parameter and buffer it receives, as PyTorch's DDP starts
// every replica from rank 0's state. Not under a fault layer: a mutation that skips the broadcast
// must see the values drawn.
std::set<std::string> received_from_dp_rank0(const Resolution& res, const Communicator* dp,
                                             const RunLayer* layer) {
    std::set<std::string> names;
    if (layer || !res.dp.active || !dp || dp->rank() == 0) return names;
    for (const BroadcastState& s : construction_broadcast(res.dp)) names.insert(s.name);
    return names;
}

bool receives_all_state(const Module& m, const std::set<std::string>& received) {
    if (received.empty() || (m.params().empty() && m.buffers().empty())) return false;
    for (const auto* list : {&m.params(), &m.buffers()})
        for (const auto& e : *list)
            if (!received.count(join_name(m.fqn(), e.name))) return false;
    return true;
}

}  // namespace

Plan single_device_plan() {
    Plan p;
    p.dims = ParallelDims({{"world", 1}}, {std::nullopt});
    return p;
}

Plan reference_plan(const Plan& plan) {
    Plan p = single_device_plan();
    p.mixed_precision = plan.mixed_precision;
    p.round_microbatches = plan.microbatches_per_round();  // a pipeline's microbatches, on one device
    p.gradient_accumulation = plan.gradient_accumulation;  // in as many rounds: the same microbatches
    p.gradient_accumulation_where = plan.gradient_accumulation_where;
    p.loss_normalization = plan.loss_normalization;  // the one-device meaning of the same choice
    p.loss_normalization_where = plan.loss_normalization_where;
    p.float8 = plan.float8;  // each rank's rows scaled apart, as the ranks scale their own
    if (p.float8) {
        p.float8->row_groups = {plan.dims.data_size(),
                                plan.context_parallel ? plan.dims.size(DimRole::cp) : 1,
                                plan.context_parallel && plan.context_parallel->load_balance};
        if (float8_all_gathers(plan)) {  // its weights cast as the plan's gathers cast them
            const DataParallelSpec& dp = *plan.data_parallel;
            if (dp.mode == DataParallelMode::fully_shard) p.float8->weights_from_masters.push_back("");
            for (const std::string& u : dp.fully_shard) p.float8->weights_from_masters.push_back(u);
        }
    }
    return p;
}

// One rank's model laid out as the plan says, a straight line of steps as torchtitan's
// parallelize_llama (pipeline_llm's stage split first): each a method below.
Run::Run(const RunInputs& in, const Plan& plan, Communicator& world, RunLayer* layer,
         const ResolvedPlan* resolved)
    : model_(build_model(in, builds_on_device(in, plan, layer))),
      plan_(plan),
      world_(world),
      be_(backend_for(in.device)),
      counter_(std::make_shared<CommCounter>()),
      device_(in.device),
      layer_(layer) {
    load_data(in);
    const bool counts_tokens = resolve_loss();
    build_groups(counts_tokens);
    resolve(resolved);
    apply_float8();  // on the whole model: its selection names the head (a stage's model may lack it)
    if (plan.pipeline) keep_own_stage();
    apply_checkpointing();
    init_params(in);
    apply_tensor_parallel(in);
    apply_expert_parallel();
    broadcast_tied_weights();
    model_.to_device(in.device);  // built, initialised and distributed on the host
    apply_data_parallel();
    apply_mixed_precision();
    optimizer_ = std::make_unique<Optimizer>(model_.optimizer, be_);
    build_schedule();
}

Run::~Run() = default;

// The plan's resolution for the whole model (a stage's boundary layouts come from it): the one made
// before the run (verify's lint) rebound to this rank's model, else resolved here.
void Run::resolve(const ResolvedPlan* resolved) {
    if (!resolved) {
        res_ = resolve_plan(model_, plan_);
        return;
    }
    PTOOL_REQUIRE(resolved->plan == &plan_, "a resolution of another plan than the run's");
    res_ = resolved->resolution->rebound(*resolved->model, model_);
}

// The data source's batches (shapes only on meta).
void Run::load_data(const RunInputs& in) {
    std::optional<MetaAllocation> meta;
    if (in.device == Device::meta) meta.emplace();
    MemoryUseScope use(MemoryUse::batch);
    data_ = std::make_unique<DataSource>(model_, in.data, in.data_path);
}

// The loss normalisation the run executes and whether a moe layer adds a balancing loss; returns
// whether the run counts over the ranks whose tokens differ (the tokens group): a balancing
// layer's statistics (the whole model's, every rank alike) or global_tokens' count.
bool Run::resolve_loss() {
    bool balances = false;
    for_each_module(*model_.root, [&](const std::string&, Module& m) {
        if (const RoutedExperts* moe = m.routed_experts()) {
            balances |= moe->aux_loss_coef() > 0 || moe->capacity_factor() > 0;
            aux_losses_ |= moe->aux_loss_coef() > 0;
        }
    });
    normalization_ =
        layer_ ? layer_->loss_normalization(plan_.normalization(model_)) : plan_.normalization(model_);
    return balances || normalization_ == LossNormalization::global_tokens;
}

// The mesh, the roles' groups and the combined groups the run needs (ParallelDims::group), in the
// same order on every rank (each is a collective split).
void Run::build_groups(bool counts_tokens) {
    mesh_ = std::make_unique<DeviceMesh>(plan_.mesh(), world_, counter_);
    if (layer_) layer_->wrap_mesh(*mesh_, plan_);
    // a role the plan does not have is a one-rank group, so the same code serves every plan
    solo_ = world_.split(world_.rank(), 0);
    tp_ = &comm(DimRole::tp);
    cp_ = &comm(DimRole::cp);
    Communicator* batch = mesh_->group(plan_.dims.group(GroupName::batch));
    batch_ = batch ? batch : solo_.get();
    if (counts_tokens) tokens_ = mesh_->group(plan_.dims.group(GroupName::tokens));
    stage_comm_ = &world_, stage_dims_ = plan_.mesh();  // without a pipeline (keep_own_stage: its stage's)
}

// Activation checkpointing: the modules the resolution marks recompute in their backward.
void Run::apply_checkpointing() {
    for (const Module* m : res_.checkpointing.checkpointed) const_cast<Module*>(m)->set_checkpointed(true);
    for (const Module* m : res_.checkpointing.selective) const_cast<Module*>(m)->set_selective(true);
    for (const Module* m : res_.checkpointing.recompute_core)
        const_cast<Module*>(m)->attention_core()->set_recompute_core(true);
}

// Float8 training: the plan's linears swapped for torchao's Float8Linear before any is parallelised
// (torchtitan's model converters run before parallelize_llama).
void Run::apply_float8() {
    if (!plan_.float8) return;
    // On a GPU the same emulation runs on the device's tensors, its per-element work staged through
    // the host (model/float8_gemm.cpp); cuBLASLt's float8 GEMMs are docs/float8.md's next step.
    // A run computes in float32 or bfloat16 (torchtitan's float8 runs: bf16 mixed precision), where
    // verify follows the reference's casts at near-ties (model/float8_log.h); explain and plan (meta)
    // take any dtype. Not float64 (the emulation accumulates in float32, as the float8 GEMM does,
    // below float64's tolerance), nor float16 (no published float8 run computes in it).
    if (const DType compute = plan_.compute_dtype(model_.dtype);
        device_ != Device::meta && compute != DType::float32 && compute != DType::bfloat16)
        throw InputError(plan_.float8->where,
                         fmt::format("float8 with {} compute: a run computes float8 linears in float32 or "
                                     "bfloat16 (docs/float8.md); compute in one of them, or explain the plan",
                                     dtype_name(compute)));
    ptool::apply_float8(model_, res_);  // resolved once (Resolution::float8), rebound to this model
}

// The initial values this rank draws itself (not --init's, not on meta).
void Run::init_params(const RunInputs& in) {
    if (!draws_init(in)) return;
    // every module draws its own values, but for what this rank builds as pieces or receives:
    // src_data_rank k's broadcast (a rank other than k), DDP's from dp rank 0
    const bool own = builds_own_shards(in, plan_, layer_);
    const bool lazy = draws_lazily(in, plan_, layer_);
    const bool receives = lazy && !own && tp_->rank() != *plan_.src_data_rank;
    const std::set<std::string> received =
        received_from_dp_rank0(res_, res_.dp.active ? batch_ : nullptr, layer_);
    model_.init_params_except([&](const Module& m) {
        const ResolvedStyle* rs = res_.style_of(m);
        if (rs) return lazy && (own ? builds_own_pieces(*rs) : receives && distributes_all_own(*rs));
        return receives_all_state(m, received);
    });
}

// Tensor parallel: the styles cut the parameters and install their hooks (parallelize).
void Run::apply_tensor_parallel(const RunInputs& in) {
    if (layer_) layer_->before_parallelize(model_, res_);
    tp_params_ = parallelize(model_, plan_, res_, *mesh_, builds_own_shards(in, plan_, layer_));
    if (layer_) layer_->after_parallelize(model_, plan_, res_, tp_params_, *mesh_);
}

// Expert parallel: each rank keeps its own experts; their gradients' replicas are the other data
// dims, none where fully_shard shards them over dp_shard (ep then borrows dp_replicate).
void Run::apply_expert_parallel() {
    if (!res_.ep.active) return;
    Communicator* replicas =
        res_.dp.experts_sharded ? nullptr : mesh_->group(plan_.dims.group(GroupName::expert_replicas));
    expert_parallel_ =
        std::make_unique<ExpertParallel>(model_, layer_ ? layer_->expert_parallel(res_.ep) : res_.ep,
                                         plan_.dims.index(DimRole::ep), comm(DimRole::ep), replicas, be_);
}

// Data parallel (DDP, fully_shard, ZeRO) over the batch group, on the tensors as the device holds them.
void Run::apply_data_parallel() {
    if (!res_.dp.active) return;
    // DDP fills its buckets with the tensors it sees: the TP-local ones, so resolved again here
    std::vector<Diagnostic> unused;
    res_.dp = resolve_data_parallel(model_, plan_, unused, unused);
    if (plan_.pipeline) check_tied_units(model_, plan_, res_.dp, true);  // this rank's stages
    executed_dp_ = layer_ ? layer_->data_parallel(res_.dp) : res_.dp;
    for (FsdpUnitSpec& u : executed_dp_.units)  // each rank shards the experts it owns
        if (u.experts)
            std::erase_if(u.params, [&](const std::string& name) { return !expert_parallel_->owns(name); });
    data_parallel_ = std::make_unique<DataParallel>(model_, plan_, executed_dp_, *mesh_, *batch_, be_);
    mark_root_hooks();
}

// Mixed precision, where the plan's param_dtype differs from the model's.
void Run::apply_mixed_precision() {
    if (!plan_.mixed_precision || plan_.mixed_precision->param_dtype == model_.dtype) return;
    if (!plan_.data_parallel)
        check_mixed_precision(model_, plan_, {});  // the reference's (the plan's checked them all)
    mixed_precision_ = std::make_unique<MixedPrecision>(
        model_, *plan_.mixed_precision, be_,
        [&](const Parameter* p) {
            return data_parallel_ && data_parallel_->placement(p).is_shard();  // fully_shard casts its own
        },
        plan_.float8 ? plan_.float8->weights_from_masters : std::vector<std::string>{});
}

// The schedule of a step's actions: gradient_accumulation's rounds (the plan's, else the model's),
// each of the plan's microbatches (one without a pipeline).
void Run::build_schedule() {
    const int rounds = static_cast<int>(plan_.accumulation_rounds(model_)),
              m = plan_.microbatches_per_round();
    if (plan_.pipeline) {
        schedule_ = checked_pipeline_schedule(plan_.pipeline->schedule, stages_, m, rounds,
                                              plan_.pipeline->virtual_stages);
    } else {
        schedule_ = accumulation_schedule(rounds * m);
        check_schedule(schedule_);
    }
    if (layer_) {  // a fault's order, checked as any (ScheduleViolation names what it breaks)
        layer_->schedule(schedule_);
        check_schedule(schedule_);
    }
}

void Run::set_schedule(Schedule s) {
    PTOOL_REQUIRE(s.stages == schedule_.stages && s.microbatches == schedule_.microbatches &&
                      s.stage_rank == schedule_.stage_rank,
                  "a schedule of {} stages and {} microbatches for a run of {} and {} (placed alike)",
                  s.stages, s.microbatches, schedule_.stages, schedule_.microbatches);
    check_schedule(s);
    schedule_ = std::move(s);
}

ReduceOp Run::cp_reduce() const {
    if (model_.loss == LossKind::sum) return ReduceOp::sum;
    return normalization_ == LossNormalization::global_tokens ? ReduceOp::sum : ReduceOp::avg;
}

ZeroOptimizer* Run::zero() const {
    return data_parallel_ ? data_parallel_->zero() : nullptr;
}

void Run::gather_sharded_gradients() {
    if (ZeroOptimizer* z = zero()) z->gather_gradients();
}

Communicator& Run::comm(DimRole role) const {
    return plan_.dims.has(role) ? mesh_->comm(plan_.dims.index(role)) : *solo_;
}

double Run::activation_grad_scale() const {
    const int ranks = data_comm().size() * comm(DimRole::cp).size();
    const bool per_rank_mean =
        model_.loss != LossKind::sum && plan_.normalization(model_) != LossNormalization::global_tokens;
    return ranks > 1 && per_rank_mean ? 1.0 / ranks : 1.0;
}

Placements Run::placements(const Parameter* p) const {
    Placements out;
    if (auto it = tp_params_.find(p); it != tp_params_.end())
        out.then(plan_.dims.index(DimRole::tp), it->second.placement);
    const bool expert = expert_parallel_ && expert_parallel_->manages(p);
    if (expert) {  // whole on its owner; there fully_shard's rows, where it shards them (absent rows
                   // elsewhere)
        out.then(expert_parallel_->mesh_dim(), expert_parallel_->placement(p));
        if (!executed_dp_.experts_sharded) return out;
    }
    if (data_parallel_) {
        const Placement dp = expert ? Placement::shard(0) : data_parallel_->placement(p);
        out.then(data_parallel_->shard_dim(), dp);
        // dp_shard x cp flattened (torchtitan's dp_shard_cp): one chunk of the rows over both
        if (plan_.dims.cp_shards_params() && !dp.is_replicate()) out.join(plan_.dims.index(DimRole::cp));
    }
    return out;
}

Communicator& Run::comm(const std::vector<int>& mesh_dims) const {
    if (mesh_dims.size() == 1) return comm(mesh_dims[0]);
    const MeshGroup g = plan_.dims.group(GroupName::dp_shard_cp);
    PTOOL_REQUIRE(g.dims == mesh_dims, "no combined group over {} mesh dims but dp_shard_cp's",
                  mesh_dims.size());
    return *mesh_->group(g);
}

double Run::global_items(const StepState& st) {
    Shape out = model_.output_shape;  // one microbatch's output on this rank (mean's items)
    if (!out.empty()) out[0] = st.mine;
    if (context_ && out.size() > 1) out[1] /= cp_->size();
    int64_t mine = 0;
    for (int m = 0; m < st.microbatches; ++m)
        mine += loss_items(model_.loss, out, microbatch_target(st, m), model_.ignore_index);
    if (!tokens_ || tokens_->size() == 1) return device_ == Device::meta ? 1.0 : static_cast<double>(mine);
    CommScope scope(tokens_->counter().get(), "(loss)", CommSiteKind::loss_items);
    if (device_ == Device::meta) {  // a simulated step: the collective, no value
        Tensor count({1}, DType::float64, Device::meta);
        tokens_->all_reduce(count, ReduceOp::sum);
        return 1.0;
    }
    Tensor count = Tensor::from_doubles({1}, DType::float64, {static_cast<double>(mine)}).to_device(device_);
    tokens_->all_reduce(count, ReduceOp::sum);
    return count.to_device(Device::cpu).item(0);
}

double Run::clip_gradients(const std::vector<std::pair<std::string, ParamPtr>>& params) {
    GradNormInputs in;
    in.params = params;
    in.placements = [&](const Parameter* p) { return placements(p); };
    for (int d : plan_.dims.param_nesting()) in.dims.push_back({d, &mesh_->comm(d)});
    if (const ZeroOptimizer* z = zero(); z && z->stage() == 2) {  // the shards' squares, summed over dp
        const int dp = data_parallel_->shard_dim();
        in.grads = [z](const Parameter* p) {
            return z->manages(p) ? z->grad_pieces(p) : std::vector<Tensor>{p->grad};
        };
        in.placements = [this, z, dp](const Parameter* p) {
            Placements pl = placements(p);
            return z->manages(p) ? pl.then(dp, Placement::shard(0)) : pl;
        };
    }
    if (stages_ > 1) {
        in.stages = &comm(DimRole::pp);
        in.counted = [this](const Parameter* p) { return !shared_copy(p); };
        if (plan_.pipeline->virtual_stages > 1)  // a rank's stages are not consecutive: sum in model order
            in.order = [this](const Parameter* p) { return param_order_.at(p); };
    }
    if (layer_) {
        const int64_t microbatches = schedule_.microbatches;
        in.norm_used = [this, microbatches](double norm) { return layer_->clip_norm(norm, microbatches); };
    }
    return clip_grad_norm(in, model_.clip_grad_norm, be_);
}

StepOutput Run::step(int64_t k, const StepObserver& observer) {
    StepState st;
    st.step = k;
    st.observer = observer;
    st.batch = data_->batch(k);
    Batch& b = st.batch;
    if (b.input.device() != device_) {
        b.input = b.input.to_device(device_);
        if (b.target.defined()) b.target = b.target.to_device(device_);
    }
    // N microbatches of the global batch; under data parallelism each is split over the data ranks
    st.microbatches = schedule_.microbatches;
    st.rows = b.input.dim() ? b.input.size(0) : 0;
    st.mine = st.rows / st.microbatches / batch_->size();  // this rank's rows of each microbatch
    if (plan_.context_parallel) context_ = context_shard(plan_, b.input.size(1), *cp_);
    if (normalization_ == LossNormalization::global_tokens) st.items = global_items(st);
    if (probe_parts_ > 1)
        ring_probe_ = ContextShard::make(b.input.size(1), probe_parts_, 0, probe_balance_,
                                         RotateMethod::alltoall, nullptr);
    // timed from the batch on the device to the optimizer step's end (the ranks' host-to-device
    // copies of the batch are data loading: at tp=8 on an H100 they were half of a step)
    be_.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const auto params = model_.named_parameters();
    if (ZeroOptimizer* z = zero()) z->before_step();  // ZeRO-2: the full gradients for the backward
    for (const auto& [name, p] : params) be_.fill(p->grad, 0.0);
    if (mixed_precision_) mixed_precision_->to_compute();
    StepOutput out;
    const std::vector<Action>& actions = schedule_.ranks[stage_];  // this pp rank's
    for (size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        if (a.is_p2p()) {  // with the sends and receives right after it
            size_t j = i;
            while (j < actions.size() && actions[j].is_p2p()) ++j;
            const std::vector<Action> batch(actions.begin() + static_cast<std::ptrdiff_t>(i),
                                            actions.begin() + static_cast<std::ptrdiff_t>(j));
            if (action_observer_) action_observer_(batch, false);
            exchange(st, batch);
            if (action_observer_) action_observer_(batch, true);
            i = j - 1;
            continue;
        }
        if (action_observer_) action_observer_({a}, false);
        switch (a.kind) {
            case ActionKind::forward:
                forward(st, a.stage, a.microbatch);
                break;
            case ActionKind::backward:
                backward(st, a.stage, a.microbatch);
                break;
            case ActionKind::backward_input:
                backward(st, a.stage, a.microbatch, true);
                break;
            case ActionKind::backward_weight:
                backward_weight(st, a.stage, a.microbatch);
                break;
            case ActionKind::grad_sync:
                PTOOL_REQUIRE(st.pending_weights.empty(), "the gradient sync before W{}@{}",
                              st.pending_weights.begin()->first.first,
                              st.pending_weights.begin()->first.second);
                if (mixed_precision_) mixed_precision_->to_masters();
                sync_context_gradients(params, cp_reduce(), *cp_, [this](const Parameter* p) {
                    return plan_.dims.cp_shards_params() && data_parallel_->placement(p).is_shard();
                });  // nothing without cp; fully_shard's over dp_shard x cp averaged its own
                if (layer_) layer_->before_gradient_sync(model_, world_);
                if (data_parallel_)
                    data_parallel_->after_backward();  // once per step (DDP's no_sync on the others)
                if (expert_parallel_) expert_parallel_->after_backward();
                sync_tied_gradients();
                break;
            case ActionKind::clip:
                if (model_.clip_grad_norm > 0) out.grad_norm = clip_gradients(params);
                break;
            case ActionKind::optimizer_step:
                if (ZeroOptimizer* z = zero()) {  // the rank's shards, then their all_gather
                    std::vector<std::pair<std::string, ParamPtr>> others;
                    for (const auto& [name, p] : params)
                        if (!z->manages(p.get())) others.push_back({name, p});
                    z->step(*optimizer_, others);
                } else {
                    optimizer_->step(params);
                }
                // torchtitan's post-optimizer hook: the next step's float8 all-gather scales
                if (data_parallel_ && plan_.float8 && plan_.float8->precompute_scale)
                    data_parallel_->precompute_float8_scales();
                if (layer_) layer_->after_optimizer_step(model_);
                break;
            default:
                PTOOL_REQUIRE(false, "{} is not run here", a.str());
        }
        if (action_observer_) action_observer_({a}, true);
    }
    drop_torch_output(st);
    for (Tensor& t : st.torch_stage_outputs) torch_release(t);  // (pipelining clears them at the next step)
    st.torch_stage_outputs.clear();
    for (auto& [m, done] : st.done) {  // in microbatch order, as the reference's rows are
        out.outputs.push_back(std::move(done.output));
        out.loss += done.loss;
        out.aux_loss += done.aux;
    }
    if (plan_.pipeline && aux_losses_) {
        // the balancing losses of the stages before the last, summed over the pp ranks into the
        // step's loss on the last stage's rank: a logging collective, as Megatron's reduction of
        // its aux-loss tracker over pipeline ranks (not counted: no plan's training needs it)
        CountingPaused pause(comm(DimRole::pp).counter().get());
        Tensor aux = Tensor::scalar(st.aux_before_last, DType::float64).reshape({1});
        comm(DimRole::pp).all_reduce(aux, ReduceOp::sum);
        if (!st.done.empty()) out.loss += aux.item(0), out.aux_loss += aux.item(0);
    }
    be_.synchronize();
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.started = std::chrono::duration<double>(t0.time_since_epoch()).count();
    return out;
}

}  // namespace ptool
