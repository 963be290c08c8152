// A microbatch's work on a stage (Run's, train/run.h): its rows of the step's batch, its forward
// with the loss on the last stage, its backward, and a split backward's I and W (zero_bubble, zbv,
// dualpipev: the parameter-gradient work deferred from the I, model/module.h weight_work).
#include <tuple>

#include "core/framework_memory.h"
#include "model/loss.h"
#include "parallel/loss_parallel.h"
#include "parallel/redistribute.h"
#include "train/framework_loss.h"
#include "train/run.h"
#include "train/stage.h"

namespace ptool {

int64_t Run::first_row(const StepState& st, int m) const {
    return m * (st.rows / st.microbatches) + batch_->rank() * st.mine;
}

Tensor Run::microbatch_target(const StepState& st, int m) const {
    if (!st.batch.target.defined()) return Tensor();
    Tensor target = st.batch.target.narrow(0, first_row(st, m), st.mine);
    return context_ ? context_->take(target, 1) : target;
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
    f.ctx = RunContext{};
    f.ctx.backend = &be_, f.ctx.seed = model_.seed, f.ctx.step = st.step, f.ctx.training = true;
    f.ctx.row_offset = first, f.ctx.tp_rank = tp_->rank(), f.ctx.tp_parts = tp_->size();
    f.ctx.observer = st.observer;
    f.ctx.microbatch = m;
    f.ctx.tp = tp_;
    if (expert_parallel_) f.ctx.ep = &comm(DimRole::ep);
    f.ctx.routing = logs_.routing, f.ctx.routing_replays = replays_;
    f.ctx.float8_log = logs_.float8, f.ctx.float8_replays = replays_;
    if (logs_.float8 && replays_) f.ctx.reference_grad_scale = activation_grad_scale();
    double scale = 1.0 / static_cast<double>(st.microbatches);       // each microbatch's loss is divided by
    if (layer_) scale = layer_->loss_scale(scale, st.microbatches);  // their count (a fault's: its own)
    f.ctx.aux_loss = &f.aux, f.ctx.loss_scale = scale, f.ctx.tokens = tokens_;
    f.ctx.grads_summed = normalization_ == LossNormalization::global_tokens;
    if (context_) f.ctx.context = &*context_;
    if (plan_.float8) f.ctx.float8_row_groups = plan_.float8->row_groups;
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
    std::optional<FrameworkLoss>
        as_pytorch;  // the loss's memory and kernels as PyTorch's (train/framework_loss.h)
    // mean_per_call: the call's own mean, divided by the microbatch count; global_tokens: the call's
    // sum divided by the step's items, nothing more (a fault layer may scale either)
    const LossDivisor divisor{model_.ignore_index, st.items};
    const double loss_scale = st.items ? (layer_ ? layer_->loss_scale(1.0, st.microbatches) : 1.0) : scale;
    if (plan_.loss_parallel) {  // cross_entropy on the vocabulary shards: nothing gathered
        f.output = {to_dtype(be_, y.t, model_.dtype), y.p, y.global};
        f.loss = vocab_parallel_cross_entropy(f.output, target, divisor, *tp_);
    } else {
        f.output = redistribute(y, Placement::replicate(), *tp_);  // the loss sees the whole output
        as_pytorch.emplace(f.ctx, model_.loss, f.output.t);
        f.output.t = to_dtype(be_, f.output.t, model_.dtype);
        f.loss = compute_loss(be_, model_.loss, f.output.t, target, divisor);
    }
    f.aux_scaled = f.aux * scale;
    f.loss_value = f.loss.value * loss_scale + f.aux_scaled;
    if (loss_scale != 1.0) be_.scale(f.loss.grad, loss_scale, f.loss.grad);
    f.grad = to_dtype(be_, f.loss.grad, compute);
    as_pytorch.reset();
    f.dy = plan_.loss_parallel
               ? Placed{f.grad, y.p, y.global}
               : redistribute(Placed(f.grad).relabeled(Placement::replicate()), grad_placement(y.p), *tp_);
    drop_torch_output(st);  // `out = model(...)` has returned: the previous microbatch's output goes
}

// The framework tally's held model output (StepState::torch_output) released, if any.
void Run::drop_torch_output(StepState& st) {
    if (st.torch_output.defined()) torch_release(st.torch_output), st.torch_output = Tensor();
}

// A microbatch's backward on stage s from its loss's gradient (the last stage) or the one the next
// stage sent (or handed back, on this rank); what its forward kept goes, but the output and the
// loss, which the step returns, and the input's gradient a stage sends back (or hands back).
void Run::backward(StepState& st, int s, int m, bool input_only) {
    auto it = st.inflight.find({s, m});
    PTOOL_REQUIRE(it != st.inflight.end(), "backward of microbatch {} on stage {} without its forward", m, s);
    auto pend = [&](StepState::PendingWeights w) {  // what the W of this I runs
        const bool fresh = st.pending_weights.emplace(std::pair{s, m}, std::move(w)).second;
        PTOOL_REQUIRE(fresh, "I{}@{} runs twice", s, m);
    };
    if (input_only && s == 0)  // no input gradient to send: torch's I does nothing here, its W all
        return pend({RunContext{}, {}, true});
    Inflight& f = it->second;
    WeightWork work;
    if (input_only) f.ctx.weight_work = &work;
    if (s + 1 < stages_) {
        auto g = st.received_grads.find({s, m});
        PTOOL_REQUIRE(g != st.received_grads.end(),
                      "stage {} runs B{} before receiving its output's gradient", s, m);
        f.dy = std::move(g->second);
        st.received_grads.erase(g);
    }
    if (layer_ && !input_only) layer_->before_backward(model_, s, m);
    {
        MemoryUseScope use(MemoryUse::activations);
        if (s + 1 == stages_) framework_loss_backward(f.ctx);
        if (stages_ == 1)
            model_.root->backward(f.ctx, f.dy);
        else if (Placed dx = stage_backward(f.ctx, held(s).modules, f.dy,
                                            held(s).root_hooks ? model_.root.get() : nullptr);
                 s > 0 && schedule_.receives_input(s))
            st.to_send_back[{s, m}] = std::move(dx);
        else if (s > 0)  // the stage before is on this rank: handed back
            st.received_grads[{s - 1, m}] = std::move(dx);
    }
    if (input_only) {
        f.ctx.weight_work = nullptr;
        pend({f.ctx, std::move(work), false});
    }
    if (s + 1 == stages_) st.done[m] = {std::move(f.output), f.loss_value, f.aux_scaled};
    // PyTorch's loop holds the microbatch's output (its `out`) past its backward, to the step's end
    // or the next microbatch's forward, and a pipeline's last stage holds every microbatch's
    // (torch_stage_outputs), in the compute dtype. A stand-in where ptool's own kept output is a
    // copy in the model's dtype made outside the framework tally (cross_entropy's cast, in
    // train/framework_loss.h's scope); where no cast was made, the tally holds the output (tp's
    // gathered one included); another loss's cast and loss_parallel's are counted (erring high by
    // the copy's dtype over the output's).
    std::optional<std::pair<Shape, DType>> stand_in;
    if (s + 1 == stages_ && !plan_.loss_parallel && model_.loss == LossKind::cross_entropy &&
        f.y.t.defined() && f.y.t.dtype() != model_.dtype)
        if (const Tensor& kept = st.done[m].output.t; kept.defined())
            stand_in = {kept.shape(), f.y.t.dtype()};
    st.inflight.erase(it);
    if (stand_in && stages_ > 1) {
        st.torch_stage_outputs.push_back(
            torch_only(stand_in->first, stand_in->second, MemoryUse::activations));
    } else if (stand_in) {
        drop_torch_output(st);
        st.torch_output = torch_only(stand_in->first, stand_in->second, MemoryUse::activations);
    }
}

// A microbatch's W: the parameter-gradient work its I left, in the order one backward runs it, with
// the hooks' post_backward (tp's reductions of partial gradients); the first stage's whole backward.
void Run::backward_weight(StepState& st, int s, int m) {
    auto it = st.pending_weights.find({s, m});
    PTOOL_REQUIRE(it != st.pending_weights.end(), "W{}@{} before its I", s, m);
    StepState::PendingWeights pending = std::move(it->second);
    st.pending_weights.erase(it);
    // a fault layer's W (RunLayer::weight_fault): the work runs (its hooks' state stays
    // consistent), its gradients' change undone or added again, or its activations read as freed
    const WeightFault fault = layer_ ? layer_->weight_fault(s, m) : WeightFault::none;
    // each gradient's tensor and values before (fully_shard may bind a fresh one in the W: all of
    // that one is the W's)
    std::vector<std::tuple<ParamPtr, Tensor, Tensor>> before;
    if (fault == WeightFault::skipped || fault == WeightFault::doubled)
        for (const auto& [name, p] : model_.named_parameters())
            before.emplace_back(p, p->grad, p->grad.clone());
    std::vector<std::pair<Tensor, Tensor>> freed;  // each read, and what it held
    if (fault == WeightFault::freed_input && !pending.whole)
        for (Tensor& t : pending.work.reads)
            if (const int64_t n = t.numel(); n > 1) {  // reused: another allocation's values (shifted by one)
                freed.emplace_back(t, t.clone());
                Tensor flat = t.reshape({n}), was = freed.back().second.reshape({n});
                Tensor head = flat.narrow(0, 0, n - 1), tail = flat.narrow(0, n - 1, 1);
                be_.copy(was.narrow(0, 1, n - 1), head);
                be_.copy(was.narrow(0, 0, 1), tail);
            }
    if (pending.whole) {
        backward(st, s, m);
    } else {
        if (layer_) layer_->before_backward(model_, s, m);  // (its gradients accumulate here, not at the I)
        MemoryUseScope use(MemoryUse::activations);
        run_weight_work(pending.ctx, pending.work);
    }
    for (auto it = freed.rbegin(); it != freed.rend(); ++it)
        be_.copy(it->second, it->first);     // shared: last first
    for (auto& [p, handle, was] : before) {  // the W's change to each gradient, undone or added again
        Tensor& grad = p->grad;
        if (grad.numel() == 0) continue;
        Tensor change = grad.clone();
        if (grad.shares_storage(handle) && grad.shape() == was.shape()) be_.axpy(-1.0, was, change);
        be_.axpy(fault == WeightFault::doubled ? 1.0 : -1.0, change, grad);
    }
}

}  // namespace ptool
