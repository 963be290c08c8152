#include "verify/run.h"

#include <chrono>
#include <optional>
#include <set>

#include "core/tensor_ops.h"
#include "model/loss.h"
#include "parallel/grad_norm.h"
#include "parallel/loss_parallel.h"
#include "parallel/redistribute.h"

namespace ptool {
namespace {

// The model's structure; its values from --init, else drawn by the Run once the mesh exists.
Model build_model(const RunInputs& in) {
    if (in.device == Device::meta) {  // shapes only: nothing initialised, nothing allocated
        MetaAllocation meta;
        return load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    }
    Model m = load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    if (in.init) load_state_dict(m, *in.init, in.init_path);
    return m;
}

// Who draws the styled modules' initial values, when nothing else needs the full parameters
// (no --init, no fault layer that cuts shards from full tensors): with src_data_rank null every
// rank draws only its own pieces from the counter-based RNG; with src_data_rank k only rank k of
// the tp dim draws them, whole, and broadcasts them (parallelize), so the other ranks neither
// draw nor hold a full copy of the model (each receives one parameter at a time).
bool draws_lazily(const RunInputs& in, const Plan& plan, const RunLayer* layer) {
    return plan.has_tensor_parallel && !in.init && !(layer && layer->needs_full_parameters()) && in.device != Device::meta;
}

bool builds_own_shards(const RunInputs& in, const Plan& plan, const RunLayer* layer) {
    return draws_lazily(in, plan, layer) && !plan.src_data_rank;
}

// Whether the run draws its initial values itself (after the mesh exists, so that it can leave
// out what it receives), not --init's and not on meta.
bool draws_init(const RunInputs& in) { return !in.init && in.device != Device::meta; }

// What a dp rank other than 0 receives from DDP's construction broadcast (construction_broadcast):
// it need not draw a module whose every parameter and buffer it receives, as PyTorch's DDP starts
// every replica from rank 0's state. Not under a fault layer: a mutation that skips the broadcast
// must see the values drawn.
std::set<std::string> received_from_dp_rank0(const Resolution& res, const Communicator* dp, const RunLayer* layer) {
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
    p.mesh = {{"world", 1}};
    return p;
}

Plan reference_plan(const Plan& plan) {
    Plan p = single_device_plan();
    p.mixed_precision = plan.mixed_precision;
    return p;
}

Run::Run(const RunInputs& in, const Plan& plan, Communicator& world, RunLayer* layer)
    : model_(build_model(in)), plan_(plan), world_(world),
      be_(backend_for(in.device)), counter_(std::make_shared<CommCounter>()), device_(in.device), layer_(layer) {
    {
        std::optional<MetaAllocation> meta;
        if (in.device == Device::meta) meta.emplace();
        MemoryUseScope use(MemoryUse::batch);
        data_ = std::make_unique<DataSource>(model_, in.data, in.data_path);
    }
    mesh_ = std::make_unique<DeviceMesh>(plan.mesh, world, counter_);
    if (layer) layer->wrap_mesh(*mesh_, plan);
    res_ = resolve_plan(model_, plan);
    for (const Module* m : res_.checkpointed) const_cast<Module*>(m)->set_checkpointed(true);
    const bool own = builds_own_shards(in, plan, layer);
    if (draws_init(in)) {
        // every module draws its own values, but for what this rank builds as pieces or receives:
        // src_data_rank k's broadcast (a rank other than k), DDP's from dp rank 0
        const bool lazy = draws_lazily(in, plan, layer);
        const bool receives = lazy && !own && mesh_->comm(mesh_->dim_index(plan.tp_mesh_dim)).rank() != *plan.src_data_rank;
        const Communicator* dp = res_.dp.active ? &mesh_->comm(mesh_->dim_index(plan.data_parallel->mesh_dim)) : nullptr;
        const std::set<std::string> received = received_from_dp_rank0(res_, dp, layer);
        model_.init_params_except([&](const Module& m) {
            const ResolvedStyle* rs = res_.style_of(m);
            if (rs) return lazy && (own ? builds_own_pieces(*rs) : receives && distributes_all_own(*rs));
            return receives_all_state(m, received);
        });
    }
    if (layer) layer->before_parallelize(model_, res_);
    tp_params_ = parallelize(model_, plan, res_, *mesh_, own);
    if (layer) layer->after_parallelize(model_, plan, res_, tp_params_, *mesh_);
    model_.to_device(in.device);  // built, initialised and distributed on the host
    if (res_.dp.active) {
        // DDP fills its buckets with the tensors it sees: the TP-local ones, so resolved again here
        std::vector<Diagnostic> unused;
        res_.dp = resolve_data_parallel(model_, plan, unused, unused);
        executed_dp_ = layer ? layer->data_parallel(res_.dp) : res_.dp;
        data_parallel_ = std::make_unique<DataParallel>(model_, plan, executed_dp_, *mesh_, be_);
    }
    // a dim the plan does not use is a one-rank group, so the same code serves every plan
    if (plan.has_tensor_parallel) tp_ = &mesh_->comm(mesh_->dim_index(plan.tp_mesh_dim));
    else solo_tp_ = world.split(world.rank(), 0), tp_ = solo_tp_.get();
    if (data_parallel_) dp_ = &data_parallel_->comm();
    else solo_dp_ = world.split(world.rank(), 0), dp_ = solo_dp_.get();
    if (plan.mixed_precision && (plan.mixed_precision->param_dtype != model_.dtype)) {
        if (!plan.data_parallel) check_mixed_precision(model_, plan, {});  // the reference's (the plan's checked them all)
        mixed_precision_ = std::make_unique<MixedPrecision>(model_, *plan.mixed_precision, be_, [&](const Parameter* p) {
            return data_parallel_ && data_parallel_->placement(p).is_shard();  // fully_shard casts its own
        });
    }
    optimizer_ = std::make_unique<Optimizer>(model_.optimizer, be_);
}

Run::~Run() = default;

Placement Run::tp_placement(const Parameter* p) const {
    auto it = tp_params_.find(p);
    return it == tp_params_.end() ? Placement::replicate() : it->second.placement;
}

Placement Run::dp_placement(const Parameter* p) const {
    return data_parallel_ ? data_parallel_->placement(p) : Placement::replicate();
}

// One microbatch: forward, the loss (divided by the microbatch count), backward. Under mixed
// precision the input is cast to param_dtype (cast_forward_inputs), the loss sees the output cast
// back to the model's dtype and its gradient goes back in param_dtype.
Run::Microbatch Run::microbatch(RunContext& ctx, const Tensor& input, const Tensor& target, double scale) {
    MemoryUseScope use(MemoryUse::activations);
    const DType compute = mixed_precision_ ? mixed_precision_->compute_dtype() : model_.dtype;
    const Tensor in = dtype_is_float(input.dtype()) ? to_dtype(be_, input, compute) : input;
    const Placed x = redistribute(Placed(in), res_.input_placement, *tp_);
    const Placed y = model_.root->forward(ctx, x);
    Microbatch mb;
    LossResult loss;
    if (plan_.loss_parallel) {  // cross_entropy on the vocabulary shards: nothing gathered
        mb.output = {to_dtype(be_, y.t, model_.dtype), y.p, y.global};
        loss = vocab_parallel_cross_entropy(mb.output, target, *tp_);
    } else {
        mb.output = redistribute(y, Placement::replicate(), *tp_);  // the loss sees the whole output
        mb.output.t = to_dtype(be_, mb.output.t, model_.dtype);
        loss = compute_loss(be_, model_.loss, mb.output.t, target);
    }
    mb.loss = loss.value * scale;
    if (scale != 1.0) be_.scale(loss.grad, scale, loss.grad);
    const Tensor grad = to_dtype(be_, loss.grad, compute);
    const Placed dy = plan_.loss_parallel ? Placed{grad, y.p, y.global}
                                          : redistribute(Placed(grad).relabeled(Placement::replicate()), grad_placement(y.p), *tp_);
    model_.root->backward(ctx, dy);
    return mb;
}

double Run::clip_gradients(const std::vector<std::pair<std::string, ParamPtr>>& params) {
    GradNormInputs in;
    in.params = params;
    in.sharded_on_tp = [&](const Parameter* p) { return tp_placement(p).is_shard(); };
    in.sharded_on_dp = [&](const Parameter* p) { return dp_placement(p).is_shard(); };
    return clip_grad_norm(in, model_.clip_grad_norm, *tp_, *dp_, be_);
}

StepOutput Run::step(int64_t k, const StepObserver& observer) {
    Batch b = data_->batch(k);
    if (b.input.device() != device_) {
        b.input = b.input.to_device(device_);
        if (b.target.defined()) b.target = b.target.to_device(device_);
    }
    // N microbatches of the global batch; under data parallelism each is split over the dp ranks
    const int64_t n = model_.gradient_accumulation, rows = b.input.dim() ? b.input.size(0) : 0;
    const int64_t mine = rows / n / dp_->size();  // this rank's rows of each microbatch
    // timed from the batch on the device to the optimizer step's end (the ranks' host-to-device
    // copies of the batch are data loading: at tp=8 on an H100 they were half of a step)
    be_.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const auto params = model_.named_parameters();
    for (const auto& [name, p] : params) be_.fill(p->grad, 0.0);
    if (mixed_precision_) mixed_precision_->to_compute();
    StepOutput out;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t first = j * (rows / n) + dp_->rank() * mine;
        if (data_parallel_) data_parallel_->before_forward();
        RunContext ctx{&be_, model_.seed, k, true, first, tp_->rank(), tp_->size(), observer};
        const Microbatch mb = microbatch(ctx, b.input.narrow(0, first, mine),
                                         b.target.defined() ? b.target.narrow(0, first, mine) : Tensor(), 1.0 / static_cast<double>(n));
        out.outputs.push_back(mb.output);
        out.loss += mb.loss;
    }
    if (mixed_precision_) mixed_precision_->to_masters();
    if (layer_) layer_->before_gradient_sync(model_, world_);
    if (data_parallel_) data_parallel_->after_backward();  // once per step (DDP's no_sync on the others)
    if (model_.clip_grad_norm > 0) out.grad_norm = clip_gradients(params);
    optimizer_->step(params);
    be_.synchronize();
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.started = std::chrono::duration<double>(t0.time_since_epoch()).count();
    return out;
}

}  // namespace ptool
