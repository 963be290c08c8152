// A pipeline rank's stages (Run's, train/run.h): which stages it keeps of the model and what of
// the resolution goes with the others, the weights tied across stages (their groups, broadcast and
// gradient sum), the root's fully_shard hooks around a stage, and the activations and gradients
// the stages send each other. Tested by tests/test_pipeline*.cpp and tests/test_interleaved.cpp.
#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "parallel/redistribute.h"
#include "train/run.h"
#include "train/stage.h"

namespace ptool {

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
    const MeshGroup ranks = plan_.dims.group(GroupName::stage);  // the stage's ranks: every dim but pp
    stage_dims_.clear();
    for (int d : ranks.dims) stage_dims_.push_back(plan_.mesh()[d]);
    stage_comm_ = mesh_->group(ranks);
    auto call_of = [&](const Module* m) -> const CallLayout& {
        for (const CallLayout& c : res_.layouts.calls)
            if (c.module == m) return c;
        PTOOL_REQUIRE(false, "no call of '{}' in the layout pass", m->fqn());
        return res_.layouts.calls.front();
    };
    std::vector<StageRange> mine;
    held_.clear();
    const std::vector<int> placed = stage_placement(plan_.pipeline->schedule, pp, stages_);
    for (int s = 0; s < stages_; ++s) {
        if (placed[static_cast<size_t>(s)] != stage_) continue;
        const StageRange r = ranges[s];
        Held h;
        h.index = s;
        h.modules.assign(spine.begin() + static_cast<std::ptrdiff_t>(r.begin),
                         spine.begin() + static_cast<std::ptrdiff_t>(r.end));
        h.in = call_of(h.modules.front()).in;
        h.out = call_of(h.modules.back()).out;
        check_scatter_gather(h, s);
        held_.push_back(std::move(h));
        mine.push_back(r);
    }
    const auto named = model_.named_parameters();  // the whole model's order, before the others go
    for (size_t i = 0; i < named.size(); ++i) param_order_[named[i].second.get()] = static_cast<int64_t>(i);
    if (plan_.pipeline->virtual_stages > 1)
        for (const auto& [name, t] : model_.state_dict()) model_state_names_.push_back(name);
    tie_across_stages(spine, ranges, placed);
    keep_stages(model_, spine, mine);
    std::set<const Module*> kept;
    for_each_module(*model_.root, [&](const std::string&, Module& m) { kept.insert(&m); });
    std::vector<ResolvedStyle> styles;
    for (const ResolvedStyle& rs : res_.styles)
        if (kept.count(rs.module)) styles.push_back(rs);
    res_.styles = std::move(styles);
    res_.checkpointing.keep_only([&](const Module* m) { return kept.count(m) > 0; });
    if (layer_) {
        std::vector<std::pair<int, std::vector<Module*>>> stages;
        for (const Held& h : held_) stages.emplace_back(h.index, h.modules);
        layer_->held_stages(stages);
    }
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
                            const std::vector<int>& placed) {
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
            if (const int r = placed[static_cast<size_t>(s)];
                std::find(ranks.begin(), ranks.end(), r) == ranks.end())
                ranks.push_back(r);
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

// The later stages' copies of a tied weight start from the first stage's values.
void Run::broadcast_tied_weights() {
    for (const Tied& t : tied_) {
        CommScope scope(t.group->counter().get(), "(tied weights)", CommSiteKind::tied_weights);
        t.group->broadcast(t.param->value, 0);
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

// A stage runs its spine modules, not the root that opens them: where the root is a fully_shard
// unit of parameters the stage holds (the embedding on the first stage, the norm and head on the
// last), its hooks run around the stage, as torchtitan's fully_shard of each stage's model chunk
// gathers and reduce-scatters them.
void Run::mark_root_hooks() {
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

// Megatron splits a tensor scatter_gather sends into tp equal pieces of its elements (and asserts
// they divide): a boundary whole on every tp rank whose elements do not is exit 2 at the key.
void Run::check_scatter_gather(const Held& h, int s) const {
    const int tp = tp_->size();
    if (!plan_.pipeline->scatter_gather || tp == 1) return;
    for (const auto& [layout, crosses, what] :
         {std::tuple{h.in, s > 0, "input"}, std::tuple{h.out, s + 1 < stages_, "output"}}) {
        const int64_t n = numel_of(layout.global);
        if (crosses && layout.p.is_replicate() && n % tp != 0)
            throw InputError(
                plan_.pipeline->scatter_gather_where,
                fmt::format("scatter_gather: stage {}'s {} {} has {} elements, which do not split "
                            "into {} equal pieces over the tp ranks (Megatron's "
                            "split_tensor_into_1d_equal_chunks)",
                            s, what, shape_str(layout.global), n, tp));
    }
}

// A run of consecutive sends and receives as one batch_isend_irecv over the pp dim (as torch
// batches them), the receives into tensors of the boundary's local shape in the compute dtype. Each
// goes to or comes from the pp rank of the stage next to the action's (the schedule's placement:
// under interleaved_1f1b the last rank's stage sends on to rank 0's next one, in the V the last rank
// hands its first stage's output to its second). Under scatter_gather (Megatron's
// scatter_gather_tensors_in_pipeline), a tensor whole on every tp rank goes as this tp rank's 1/tp of its
// elements (split_tensor_into_1d_equal_chunks), and a received one is all_gathered over tp from the pieces
// (gather_split_1d_tensor).
void Run::exchange(StepState& st, const std::vector<Action>& actions) {
    const DType compute = mixed_precision_ ? mixed_precision_->compute_dtype() : model_.dtype;
    auto local = [&](const Layout& l, const Placement& p) {
        return Placed{Tensor(local_shape(l.global, p, tp_->size(), tp_->rank()), compute, device_), p,
                      l.global};
    };
    const int tp = tp_->size();
    auto scattered = [&](const Placed& x) {
        return plan_.pipeline->scatter_gather && tp > 1 && x.p.is_replicate();
    };
    std::deque<Tensor> pieces;                           // what goes instead of a whole tensor
    std::vector<std::pair<Tensor*, Tensor*>> to_gather;  // (received piece, whole tensor)
    auto piece_of = [&](Tensor& whole) {                 // this tp rank's piece of `whole`'s elements, a view
        const int64_t n = whole.numel() / tp;
        return whole.reshape({whole.numel()}).narrow(0, n * tp_->rank(), n);
    };
    auto send = [&](Placed& x) -> Tensor* {
        return scattered(x) ? &pieces.emplace_back(piece_of(x.t)) : &x.t;
    };
    auto recv = [&](Placed& x) -> Tensor* {
        if (!scattered(x)) return &x.t;
        Tensor* piece = &pieces.emplace_back(Tensor({x.t.numel() / tp}, x.t.dtype(), device_));
        to_gather.emplace_back(piece, &x.t);
        return piece;
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
                ops.push_back({P2POp::Kind::send, send(st.inflight.at(key).y), peer(a), tag});
                break;
            case ActionKind::recv_forward: {
                const Layout& in = held(a.stage).in;
                Placed& x = st.received[key] = local(in, in.p);
                ops.push_back({P2POp::Kind::recv, recv(x), peer(a), tag});
                break;
            }
            case ActionKind::send_backward:
                ops.push_back({P2POp::Kind::send, send(st.to_send_back.at(key)), peer(a), tag});
                break;
            case ActionKind::recv_backward: {
                const Layout& out = held(a.stage).out;
                Placed& g = st.received_grads[key] = local(out, grad_placement(out.p));
                ops.push_back({P2POp::Kind::recv, recv(g), peer(a), tag});
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
    for (auto& [piece, whole] : to_gather) {
        Tensor flat = whole->reshape({whole->numel()});
        tp_->all_gather(*piece, flat);
    }
    for (const Action& a : actions)
        if (a.kind == ActionKind::send_backward) st.to_send_back.erase({a.stage, a.microbatch});
}

}  // namespace ptool
