#include "verify/parallel_run.h"

#include <chrono>

#include "core/tensor_ops.h"
#include "model/batch.h"
#include "model/loss.h"
#include "model/optimizer.h"
#include "comm/comm_threads.h"
#include "verify/compare.h"

namespace ptool {
namespace {

Model build_model(const VerifyInputs& in, bool init = true) {
    Model m = load_model_text(in.model_text, in.model_path, in.dtype_override, init && !in.init);
    if (in.init) load_state_dict(m, *in.init, in.init_path);
    return m;
}

// Rank 0 learns whether every rank holds the same bytes of a replicated tensor.
bool replicas_agree(const Tensor& t, Communicator& comm) {
    if (comm.size() == 1) return true;
    Tensor all({comm.size(), t.numel()}, t.dtype());
    comm.all_gather(t.reshape({1, t.numel()}), all);
    for (int r = 1; r < comm.size(); ++r)
        if (!bitwise_equal(all.narrow(0, r, 1).reshape(t.shape()), all.narrow(0, 0, 1).reshape(t.shape()))) return false;
    return true;
}

}  // namespace

// The reference is the same loop on a one-rank mesh with no plan: every redistribution is a
// no-op at world size 1, so it computes exactly the single-device training steps.
RunRecord run_reference_record(const VerifyInputs& in) {
    Plan single;
    single.mesh = {{"world", 1}};
    RunRecord rec;
    run_rank_threads(1, CommOptions{}, [&](Communicator& world) { run_parallel_rank(world, in, single, Fault{}, &rec); });
    rec.backend = "reference";
    return rec;
}

void run_parallel_rank(Communicator& world, const VerifyInputs& in, const Plan& plan, const Fault& fault, RunRecord* out) {
    // src_data_rank null: every rank builds its own shards (an injected fault needs the full tensors)
    const bool own_shards = plan.has_tensor_parallel && !plan.src_data_rank && !in.init && fault.kind.empty();
    Model model = build_model(in, !own_shards);
    DataSource data(model, in.data, in.data_path);
    Backend& be = backend_for(Device::cpu);
    auto counter = std::make_shared<CommCounter>();
    DeviceMesh mesh(plan.mesh, world, counter);
    auto st = std::make_shared<TpState>();
    st->fault = fault;
    const Resolution res = resolve_plan(model, plan);
    if (own_shards) model.init_params_except([&](const Module& m) { return shards_parameters(res, m); });
    parallelize(model, plan, res, mesh, st, own_shards);
    Communicator& tp = st->comm ? *st->comm : world;
    const bool rank0 = world.rank() == 0;
    RunRecord rec;
    rec.init_counts = *counter;
    counter->reset();
    Optimizer optimizer(model.optimizer, be);
    const auto params = model.named_parameters();
    auto placement_of = [&](const ParamPtr& p) {
        auto it = st->param_placement.find(p.get());
        return it == st->param_placement.end() ? Placement::replicate() : it->second;
    };
    for (int64_t step = 0; step < in.steps; ++step) {
        StepRecord sr;
        sr.step = step;
        const auto t0 = std::chrono::steady_clock::now();
        for (const auto& [name, p] : params) be.fill(p->grad, 0.0);
        RunContext ctx{&be, model.seed, step, true, {}};
        if (in.record_events)
            ctx.observer = [&](const Module& m, const char* phase, const Tensor& t) {
                CountingPaused pause(counter.get());
                const Placement p = std::string(phase) == "forward" ? st->act : st->grad;
                Tensor full = full_tensor(t, p, global_shape(t, p, tp), tp);
                if (rank0) sr.events.push_back({m.fqn(), phase, full.shares_storage(t) ? full.clone() : full});
            };
        Batch b = data.batch(step);
        st->act = res.input_placement;
        Tensor x = redistribute(b.input, Placement::replicate(), res.input_placement, b.input.shape(), tp);
        Tensor y = model.root->forward(ctx, x);
        Tensor y_full = redistribute(y, st->act, Placement::replicate(), model.output_shape, tp);
        LossResult loss = compute_loss(be, model.loss, y_full, b.target);
        const Placement out_placement = st->act;
        Tensor dy = redistribute_backward(loss.grad, Placement::replicate(), out_placement, model.output_shape, tp);
        st->grad = out_placement.is_partial() ? Placement::replicate() : out_placement;
        model.root->backward(ctx, dy);
        optimizer.step(params);
        rec.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

        CountingPaused pause(counter.get());
        const std::string s = fmt::format("step{}.", step);
        auto record = [&](const std::string& name, const Tensor& local, const Placement& p) {
            Tensor full = full_tensor(local, p, global_shape(local, p, tp), tp);
            if (p.is_replicate() && !replicas_agree(local, world) && rank0) sr.inconsistent.push_back(name);
            if (!p.is_replicate() && rank0) sr.sharded.push_back(name);
            if (rank0) sr.tensors.emplace_back(name, full.shares_storage(local) ? full.clone() : full);
        };
        record(s + "output", y_full, Placement::replicate());
        record(s + "loss", Tensor::scalar(loss.value, model.dtype), Placement::replicate());
        for (const auto& [name, p] : params) record(s + "grad." + name, p->grad, placement_of(p));
        for (const auto& [name, p] : params) record(s + "param." + name, p->value, placement_of(p));
        for (const auto& [name, bf] : model.named_buffers()) record(s + "buffer." + name, bf->value, Placement::replicate());
        if (rank0) rec.steps.push_back(std::move(sr));
    }
    rec.step_counts = *counter;
    rec.world_size = world.size();
    rec.backend = world.backend();
    if (rank0 && out) *out = std::move(rec);
}

}  // namespace ptool
