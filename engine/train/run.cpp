#include "train/run.h"

#include <chrono>
#include <optional>
#include <set>

#include "core/tensor_ops.h"
#include "model/blocks.h"
#include "model/loss.h"
#include "model/moe.h"
#include "parallel/context_parallel.h"
#include "parallel/grad_norm.h"
#include "parallel/loss_parallel.h"
#include "parallel/redistribute.h"
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
    if (in.device == Device::meta) {  // shapes only: nothing initialised, nothing allocated
        MetaAllocation meta;
        return load_model_text(in.model_text, in.model_path, in.dtype_override, false);
    }
    Model m = load_model_text(in.model_text, in.model_path, in.dtype_override, false);
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
    return p;
}

Run::Run(const RunInputs& in, const Plan& plan, Communicator& world, RunLayer* layer)
    : model_(build_model(in, builds_on_device(in, plan, layer))),
      plan_(plan),
      world_(world),
      be_(backend_for(in.device)),
      counter_(std::make_shared<CommCounter>()),
      device_(in.device),
      layer_(layer) {
    {
        std::optional<MetaAllocation> meta;
        if (in.device == Device::meta) meta.emplace();
        MemoryUseScope use(MemoryUse::batch);
        data_ = std::make_unique<DataSource>(model_, in.data, in.data_path);
    }
    mesh_ = std::make_unique<DeviceMesh>(plan.mesh(), world, counter_);
    if (layer) layer->wrap_mesh(*mesh_, plan);
    // a role the plan does not have is a one-rank group, so the same code serves every plan
    solo_ = world.split(world.rank(), 0);
    tp_ = &comm(DimRole::tp);
    cp_ = &comm(DimRole::cp);
    const std::vector<int>& data = plan.dims.data_dims();
    batch_ = data.empty()       ? solo_.get()
             : data.size() == 1 ? &mesh_->comm(data[0])
                                : &mesh_->group(mesh_->add_group(data, plan.dims.data_label()));
    res_ = resolve_plan(model_, plan);  // the whole model's (a stage's boundary layouts come from it)
    bool balances = false;              // a moe layer with a load-balancing loss: its statistics' group
    for_each_module(
        *model_.root, [&](const std::string&, Module& m) {  // (the whole model's, every rank alike)
            if (const auto* moe = dynamic_cast<const Moe*>(&m)) {
                balances |= moe->options().aux_loss_coef > 0 || moe->options().capacity_factor > 0;
                aux_losses_ |= moe->options().aux_loss_coef > 0;
            }
        });
    normalization_ =
        layer ? layer->loss_normalization(plan.normalization(model_)) : plan.normalization(model_);
    if (balances || normalization_ == LossNormalization::global_tokens) {
        std::vector<int> dims = data;
        if (plan.dims.has(DimRole::cp)) dims.push_back(plan.dims.index(DimRole::cp));
        std::sort(dims.begin(), dims.end());
        std::string label;
        for (int d : dims) label += (label.empty() ? "" : "+") + plan.mesh()[d].name;
        tokens_ = dims.empty()       ? nullptr
                  : dims.size() == 1 ? &mesh_->comm(dims[0])
                                     : &mesh_->group(mesh_->add_group(dims, label));
    }
    stage_comm_ = &world_, stage_dims_ = plan.mesh();
    if (plan.pipeline) keep_own_stage();
    if (layer && plan.pipeline) {
        std::vector<std::pair<int, std::vector<Module*>>> stages;
        for (const Held& h : held_) stages.emplace_back(h.index, h.modules);
        layer->held_stages(stages);
    }
    for (const Module* m : res_.checkpointing.checkpointed) const_cast<Module*>(m)->set_checkpointed(true);
    for (const Module* m : res_.checkpointing.selective) const_cast<Module*>(m)->set_selective(true);
    for (const Module* m : res_.checkpointing.recompute_core)
        static_cast<Attention*>(const_cast<Module*>(m))->set_recompute_core(true);
    const bool own = builds_own_shards(in, plan, layer);
    if (draws_init(in)) {
        // every module draws its own values, but for what this rank builds as pieces or receives:
        // src_data_rank k's broadcast (a rank other than k), DDP's from dp rank 0
        const bool lazy = draws_lazily(in, plan, layer);
        const bool receives = lazy && !own && tp_->rank() != *plan.src_data_rank;
        const std::set<std::string> received =
            received_from_dp_rank0(res_, res_.dp.active ? batch_ : nullptr, layer);
        model_.init_params_except([&](const Module& m) {
            const ResolvedStyle* rs = res_.style_of(m);
            if (rs) return lazy && (own ? builds_own_pieces(*rs) : receives && distributes_all_own(*rs));
            return receives_all_state(m, received);
        });
    }
    if (layer) layer->before_parallelize(model_, res_);
    tp_params_ = parallelize(model_, plan, res_, *mesh_, own);
    if (layer) layer->after_parallelize(model_, plan, res_, tp_params_, *mesh_);
    if (res_.ep.active) {  // each rank keeps its own experts; their gradients' replicas: the other data dims
        std::vector<int> others;
        std::string label;  // a flattened group's name: its dims' joined by '+' (ParallelDims::label_dims)
        for (int d : data)  // but dp_shard where fully_shard shards them over it
            if (d != plan.dims.index(DimRole::ep) &&
                !(res_.dp.experts_sharded && d == plan.dims.index(DimRole::dp_shard)))
                others.push_back(d), label += (label.empty() ? "" : "+") + plan.mesh()[d].name;
        Communicator* replicas = others.empty()       ? nullptr
                                 : others.size() == 1 ? &mesh_->comm(others[0])
                                                      : &mesh_->group(mesh_->add_group(others, label));
        expert_parallel_ =
            std::make_unique<ExpertParallel>(model_, layer ? layer->expert_parallel(res_.ep) : res_.ep,
                                             plan.dims.index(DimRole::ep), comm(DimRole::ep), replicas, be_);
    }
    for (const Tied& t : tied_) {  // the later stages' copies start from the first stage's values
        CommScope scope(t.group->counter().get(), "(tied weights)", CommSiteKind::tied_weights);
        t.group->broadcast(t.param->value, 0);
    }
    model_.to_device(in.device);  // built, initialised and distributed on the host
    if (res_.dp.active) {
        // DDP fills its buckets with the tensors it sees: the TP-local ones, so resolved again here
        std::vector<Diagnostic> unused;
        res_.dp = resolve_data_parallel(model_, plan, unused, unused);
        executed_dp_ = layer ? layer->data_parallel(res_.dp) : res_.dp;
        for (FsdpUnitSpec& u : executed_dp_.units)  // each rank shards the experts it owns
            if (u.experts)
                std::erase_if(u.params,
                              [&](const std::string& name) { return !expert_parallel_->owns(name); });
        data_parallel_ = std::make_unique<DataParallel>(model_, plan, executed_dp_, *mesh_, *batch_, be_);
        // A stage runs its spine modules, not the root that opens them: where the root is a
        // fully_shard unit of parameters the stage holds (the embedding on the first stage, the
        // norm and head on the last), its hooks run around the stage, as torchtitan's fully_shard
        // of each stage's model chunk gathers and reduce-scatters them.
        std::set<const Parameter*> rooted;
        const auto named = model_.named_parameters();
        for (const FsdpUnitSpec& u : executed_dp_.units)
            if (u.fqn.empty())
                for (const auto& [name, p] : named)
                    if (std::find(u.params.begin(), u.params.end(), name) != u.params.end())
                        rooted.insert(p.get());
        for (Held& h : held_)
            for (const Module* m : h.modules)
                for_each_param(*m, [&](const std::string&, const ParamPtr& p) {
                    h.root_hooks |= rooted.count(p.get()) > 0;
                });
    }
    if (plan.mixed_precision && (plan.mixed_precision->param_dtype != model_.dtype)) {
        if (!plan.data_parallel)
            check_mixed_precision(model_, plan, {});  // the reference's (the plan's checked them all)
        mixed_precision_ =
            std::make_unique<MixedPrecision>(model_, *plan.mixed_precision, be_, [&](const Parameter* p) {
                return data_parallel_ &&
                       data_parallel_->placement(p).is_shard();  // fully_shard casts its own
            });
    }
    optimizer_ = std::make_unique<Optimizer>(model_.optimizer, be_);
    // gradient_accumulation's rounds (the plan's, else the model's), each of the plan's microbatches
    // (one without a pipeline)
    const int rounds = static_cast<int>(plan.accumulation_rounds(model_)), m = plan.microbatches_per_round();
    if (plan.pipeline) {
        schedule_ = checked_pipeline_schedule(plan.pipeline->schedule, stages_, m, rounds,
                                              plan.pipeline->virtual_stages);
    } else {
        schedule_ = accumulation_schedule(rounds * m);
        check_schedule(schedule_);
    }
}

Run::~Run() = default;

// A pipeline rank keeps its stages' layers only (train/stage.h): the modules of the other
// stages go before anything is initialised, and so do their styles and checkpointing. Each stage's
// input and output are the whole model's layouts at the stage's boundaries (one data rank's
// microbatch). Under interleaved_1f1b the rank holds stages rank, rank + pp, ... (the loop
// placement, as pipeline_schedule places them), the union of their spine ranges.
void Run::keep_own_stage() {
    PTOOL_REQUIRE(plan_.dims.has(DimRole::pp), "a pipeline plan without a pp dim");
    check_pipeline_counts(plan_);
    const std::vector<Module*> spine = model_spine(model_);
    const std::vector<StageRange> ranges = pipeline_stage_ranges(model_, spine, plan_);
    stages_ = plan_.pipeline_stages();
    PTOOL_REQUIRE(static_cast<int>(ranges.size()) == stages_, "{} stage ranges for {} stages", ranges.size(),
                  stages_);
    const int pp = comm(DimRole::pp).size();
    stage_ = comm(DimRole::pp).rank();
    std::vector<int> others;  // the stage's ranks: every dim but pp
    stage_dims_.clear();
    for (int d = 0; d < plan_.dims.ndim(); ++d)
        if (d != plan_.dims.index(DimRole::pp)) others.push_back(d), stage_dims_.push_back(plan_.mesh()[d]);
    stage_comm_ = &mesh_->group(mesh_->add_group(others, "stage"));
    auto call_of = [&](const Module* m) -> const CallLayout& {
        for (const CallLayout& c : res_.layouts.calls)
            if (c.module == m) return c;
        PTOOL_REQUIRE(false, "no call of '{}' in the layout pass", m->fqn());
        return res_.layouts.calls.front();
    };
    std::vector<StageRange> mine;
    held_.clear();
    for (int s = stage_; s < stages_; s += pp) {
        const StageRange r = ranges[s];
        Held h;
        h.index = s;
        h.modules.assign(spine.begin() + static_cast<std::ptrdiff_t>(r.begin),
                         spine.begin() + static_cast<std::ptrdiff_t>(r.end));
        h.in = call_of(h.modules.front()).in;
        h.out = call_of(h.modules.back()).out;
        held_.push_back(std::move(h));
        mine.push_back(r);
    }
    const auto named = model_.named_parameters();  // the whole model's order, before the others go
    for (size_t i = 0; i < named.size(); ++i) param_order_[named[i].second.get()] = static_cast<int64_t>(i);
    if (plan_.pipeline->virtual_stages > 1)
        for (const auto& [name, t] : model_.state_dict()) model_state_names_.push_back(name);
    tie_across_stages(spine, ranges, pp);
    keep_stages(model_, spine, mine);
    std::set<const Module*> kept;
    for_each_module(*model_.root, [&](const std::string&, Module& m) { kept.insert(&m); });
    std::vector<ResolvedStyle> styles;
    for (const ResolvedStyle& rs : res_.styles)
        if (kept.count(rs.module)) styles.push_back(rs);
    res_.styles = std::move(styles);
    res_.checkpointing.keep_only([&](const Module* m) { return kept.count(m) > 0; });
}

std::vector<int> Run::held_stages() const {
    std::vector<int> out;
    for (const Held& h : held_) out.push_back(h.index);
    if (out.empty()) out.push_back(0);
    return out;
}

const Run::Held& Run::held(int stage) const {
    for (const Held& h : held_)
        if (h.index == stage) return h;
    PTOOL_REQUIRE(false, "pp rank {} does not hold stage {}", stage_, stage);
    return held_.front();
}

// Weights tied across stages (a head tied to the embedding, each on its own stage): every stage
// that uses the parameter keeps it (keep_stages keeps a module's parameters), named as the whole
// model names it; the pp ranks whose stages use it form a group per coordinate of the other dims
// (made on every rank, in the whole model's parameter order: a collective split), first the rank
// of the first stage that uses it. Megatron's embedding group. Uses on stages of one rank share
// the one parameter there (its gradient accumulates both), and need no group.
void Run::tie_across_stages(const std::vector<Module*>& spine, const std::vector<StageRange>& ranges,
                            int pp) {
    std::map<const Parameter*, std::set<int>> users;
    for (size_t t = 0; t < ranges.size(); ++t)
        for (size_t i = ranges[t].begin; i < ranges[t].end; ++i)
            for_each_param(
                *spine[i],
                [&](const std::string&, const ParamPtr& p) { users[p.get()].insert(static_cast<int>(t)); },
                false);
    for (const auto& [name, p] : model_.named_parameters()) {
        std::vector<int> ranks;  // the pp ranks that use it, in the order of their first stage using it
        for (int s : users[p.get()])
            if (std::find(ranks.begin(), ranks.end(), s % pp) == ranks.end()) ranks.push_back(s % pp);
        if (ranks.size() < 2) continue;
        const auto at = std::find(ranks.begin(), ranks.end(), stage_);
        const bool mine = at != ranks.end();
        const int place = mine ? static_cast<int>(std::distance(ranks.begin(), at)) : 0;
        // one group per coordinate of the other dims among the ranks that hold it; alone otherwise
        const int color = mine ? stage_comm_->rank() : stage_comm_->size() + world_.rank();
        std::unique_ptr<Communicator> g =
            world_.split_known(color, place, place, mine ? static_cast<int>(ranks.size()) : 1);
        g->set_counter(counter_, plan_.dims.name(DimRole::pp));
        tied_groups_.push_back(layer_ ? layer_->wrap_group(std::move(g), name) : std::move(g));
        if (!mine) continue;
        tied_.push_back({p, tied_groups_.back().get(), place > 0});
        model_.parameter_names[p.get()] = name;
    }
}

bool Run::shared_copy(const Parameter* p) const {
    for (const Tied& t : tied_)
        if (t.param.get() == p) return t.copy;
    return false;
}

// The tied weights' gradients summed over the stages that hold them (each holds the part its own
// use contributed), after the data-parallel sync: every copy then steps alike.
void Run::sync_tied_gradients() {
    for (const Tied& t : tied_) {
        CommScope scope(t.group->counter().get(), "(tied weights)", CommSiteKind::tied_weights);
        t.group->all_reduce(t.param->grad, ReduceOp::sum);
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
        if (plan_.dims.cp_shards_params()) out.then(plan_.dims.index(DimRole::cp), dp);  // dp_shard x cp
    }
    return out;
}

int64_t Run::first_row(const StepState& st, int m) const {
    return m * (st.rows / st.microbatches) + batch_->rank() * st.mine;
}

Tensor Run::microbatch_target(const StepState& st, int m) const {
    if (!st.batch.target.defined()) return Tensor();
    Tensor target = st.batch.target.narrow(0, first_row(st, m), st.mine);
    return context_ ? context_->take(target, 1) : target;
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

// A microbatch's forward on stage s: the stage's (the model's) forward, and on the last stage the
// loss (divided by the microbatch count) and the loss's gradient, placed as the output was; kept
// until its backward. Under mixed precision the input is cast to param_dtype
// (cast_forward_inputs), the loss sees the output cast back to the model's dtype and its gradient
// goes back in param_dtype. A stage whose next stage lives on this rank hands its output on.
void Run::forward(StepState& st, int s, int m) {
    const int64_t first = first_row(st, m);
    if (data_parallel_) data_parallel_->before_forward();
    Inflight& f = st.inflight[{s, m}];
    f.ctx = RunContext{&be_, model_.seed, st.step, true, first, tp_->rank(), tp_->size(), st.observer};
    f.ctx.microbatch = m;
    f.ctx.tp = tp_;
    if (expert_parallel_) f.ctx.ep = &comm(DimRole::ep);
    f.ctx.routing = routing_, f.ctx.routing_replays = routing_replays_;
    double scale = 1.0 / static_cast<double>(st.microbatches);       // each microbatch's loss is divided by
    if (layer_) scale = layer_->loss_scale(scale, st.microbatches);  // their count (a fault's: its own)
    f.ctx.aux_loss = &f.aux, f.ctx.loss_scale = scale, f.ctx.tokens = tokens_;
    f.ctx.grads_summed = normalization_ == LossNormalization::global_tokens;
    if (context_) f.ctx.context = &*context_;
    if (ring_probe_) f.ctx.ring_probe = &*ring_probe_;
    MemoryUseScope use(MemoryUse::activations);
    const DType compute = mixed_precision_ ? mixed_precision_->compute_dtype() : model_.dtype;
    if (s == 0) {
        Tensor input = st.batch.input.narrow(0, first, st.mine);
        if (context_) input = context_->take(input, 1);  // this cp rank's positions
        f.in = dtype_is_float(input.dtype()) ? to_dtype(be_, input, compute) : input;
        f.x = redistribute(Placed(f.in), res_.input_placement, *tp_);
    } else {  // what the stage before sent or handed on
        auto it = st.received.find({s, m});
        PTOOL_REQUIRE(it != st.received.end(), "stage {} runs F{} before receiving its input", s, m);
        f.x = std::move(it->second);
        st.received.erase(it);
    }
    f.y = stages_ == 1
              ? model_.root->forward(f.ctx, f.x)
              : stage_forward(f.ctx, held(s).modules, f.x, held(s).root_hooks ? model_.root.get() : nullptr);
    if (s + 1 < stages_) {  // sent on (or handed to the next stage here); its gradient comes back
        st.aux_before_last += f.aux * scale;  // its gradient went into the stage's own backward
        if (!schedule_.sends_output(s)) st.received[{s + 1, m}] = f.y;
        return;
    }
    const Tensor target = microbatch_target(st, m);
    const Placed& y = f.y;
    // mean_per_call: the call's own mean, divided by the microbatch count; global_tokens: the call's
    // sum divided by the step's items, nothing more (a fault layer may scale either)
    const LossDivisor divisor{model_.ignore_index, st.items};
    const double loss_scale = st.items ? (layer_ ? layer_->loss_scale(1.0, st.microbatches) : 1.0) : scale;
    if (plan_.loss_parallel) {  // cross_entropy on the vocabulary shards: nothing gathered
        f.output = {to_dtype(be_, y.t, model_.dtype), y.p, y.global};
        f.loss = vocab_parallel_cross_entropy(f.output, target, divisor, *tp_);
    } else {
        f.output = redistribute(y, Placement::replicate(), *tp_);  // the loss sees the whole output
        f.output.t = to_dtype(be_, f.output.t, model_.dtype);
        f.loss = compute_loss(be_, model_.loss, f.output.t, target, divisor);
    }
    f.aux_scaled = f.aux * scale;
    f.loss_value = f.loss.value * loss_scale + f.aux_scaled;
    if (loss_scale != 1.0) be_.scale(f.loss.grad, loss_scale, f.loss.grad);
    f.grad = to_dtype(be_, f.loss.grad, compute);
    f.dy = plan_.loss_parallel
               ? Placed{f.grad, y.p, y.global}
               : redistribute(Placed(f.grad).relabeled(Placement::replicate()), grad_placement(y.p), *tp_);
}

// A microbatch's backward on stage s from its loss's gradient (the last stage) or the one the next
// stage sent (or handed back, on this rank); what its forward kept goes, but the output and the
// loss, which the step returns, and the input's gradient a stage sends back (or hands back).
void Run::backward(StepState& st, int s, int m) {
    auto it = st.inflight.find({s, m});
    PTOOL_REQUIRE(it != st.inflight.end(), "backward of microbatch {} on stage {} without its forward", m, s);
    Inflight& f = it->second;
    if (s + 1 < stages_) {
        auto g = st.received_grads.find({s, m});
        PTOOL_REQUIRE(g != st.received_grads.end(),
                      "stage {} runs B{} before receiving its output's gradient", s, m);
        f.dy = std::move(g->second);
        st.received_grads.erase(g);
    }
    if (layer_) layer_->before_backward(model_, s, m);
    {
        MemoryUseScope use(MemoryUse::activations);
        if (stages_ == 1)
            model_.root->backward(f.ctx, f.dy);
        else if (Placed dx = stage_backward(f.ctx, held(s).modules, f.dy,
                                            held(s).root_hooks ? model_.root.get() : nullptr);
                 s > 0 && schedule_.receives_input(s))
            st.to_send_back[{s, m}] = std::move(dx);
        else if (s > 0)  // the stage before is on this rank: handed back
            st.received_grads[{s - 1, m}] = std::move(dx);
    }
    if (s + 1 == stages_) st.done[m] = {std::move(f.output), f.loss_value, f.aux_scaled};
    st.inflight.erase(it);
}

// A run of consecutive sends and receives as one batch_isend_irecv over the pp dim (as torch
// batches them), the receives into tensors of the boundary's local shape in the compute dtype. Each
// goes to or comes from the pp rank of the stage next to the action's (stage s mod pp under
// interleaved_1f1b: the last rank's stage sends on to rank 0's next one).
void Run::exchange(StepState& st, const std::vector<Action>& actions) {
    const DType compute = mixed_precision_ ? mixed_precision_->compute_dtype() : model_.dtype;
    auto local = [&](const Layout& l, const Placement& p) {
        return Placed{Tensor(local_shape(l.global, p, tp_->size(), tp_->rank()), compute, device_), p,
                      l.global};
    };
    // (the key of what it sends or receives, on which stage's side; the peer's pp rank)
    auto peer = [&](const Action& a) {
        const bool up = a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_backward;
        return schedule_.rank_of(up ? a.stage + 1 : a.stage - 1);
    };
    std::vector<P2POp> ops;
    for (const Action& a : actions) {
        const int tag = p2p_tag(a);
        const std::pair<int, int> key{a.stage, a.microbatch};
        switch (a.kind) {
            case ActionKind::send_forward:
                ops.push_back({P2POp::Kind::send, &st.inflight.at(key).y.t, peer(a), tag});
                break;
            case ActionKind::recv_forward: {
                const Layout& in = held(a.stage).in;
                Placed& x = st.received[key] = local(in, in.p);
                ops.push_back({P2POp::Kind::recv, &x.t, peer(a), tag});
                break;
            }
            case ActionKind::send_backward:
                ops.push_back({P2POp::Kind::send, &st.to_send_back.at(key).t, peer(a), tag});
                break;
            case ActionKind::recv_backward: {
                const Layout& out = held(a.stage).out;
                Placed& g = st.received_grads[key] = local(out, grad_placement(out.p));
                ops.push_back({P2POp::Kind::recv, &g.t, peer(a), tag});
                break;
            }
            default:
                PTOOL_REQUIRE(false, "{} is no send or receive", a.str());
        }
    }
    try {
        comm(DimRole::pp).batch_isend_irecv(ops);
    } catch (const RuntimeError& e) {  // which stage waited for what, from whom
        std::vector<std::string> what;
        for (const Action& a : actions) {
            const bool fwd = a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_forward;
            const bool send = a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward;
            const int other = fwd == send ? a.stage + 1 : a.stage - 1;
            what.push_back(fmt::format("{} microbatch {}'s {} {} stage {}", send ? "sending" : "receiving",
                                       a.microbatch, fwd ? "activation" : "gradient", send ? "to" : "from",
                                       other));
        }
        throw RuntimeError(
            fmt::format("pipeline stage {} (pp rank {}), {}: {}", fmt::join(held_stages(), ", "),
                        comm(DimRole::pp).rank(), fmt::join(what, ", "), e.what()),
            e.kind());
    }
    for (const Action& a : actions)
        if (a.kind == ActionKind::send_backward) st.to_send_back.erase({a.stage, a.microbatch});
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
            case ActionKind::grad_sync:
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
                break;
            default:
                PTOOL_REQUIRE(false, "{} is not run here", a.str());
        }
        if (action_observer_) action_observer_({a}, true);
    }
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
