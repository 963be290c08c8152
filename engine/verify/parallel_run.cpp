#include "verify/parallel_run.h"

#include <chrono>
#include <cstring>
#include <unordered_map>

#include "core/tensor_ops.h"
#include "model/module.h"
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

Tensor on_host(const Tensor& t) { return t.device() == Device::cpu ? t : t.to_device(Device::cpu); }

// Whether every rank of comm holds the same bytes of a replicated tensor (known to every rank).
bool replicas_agree(const Tensor& t, Communicator& comm) {
    if (comm.size() == 1) return true;
    Tensor mine({1}, DType::int64), all({comm.size()}, DType::int64);
    mine.data<int64_t>()[0] = static_cast<int64_t>(tensor_digest(on_host(t)));
    comm.all_gather(mine, all);
    for (int r = 1; r < comm.size(); ++r)
        if (all.data<int64_t>()[r] != all.data<int64_t>()[0]) return false;
    return true;
}

// What rank 0 compares a tensor with as it records it (VerifyInputs::compare_with, ::golden), by name.
class Expected {
public:
    explicit Expected(const VerifyInputs& in) : in_(in) {
        if (in.golden)
            for (const auto& [name, t] : in.golden->tensors) golden_[name] = &t;
    }
    void at_step(int64_t step) {
        reference_.clear();
        if (in_.compare_with && step < static_cast<int64_t>(in_.compare_with->steps.size()))
            for (const auto& [name, t] : in_.compare_with->steps[step].tensors) reference_[name] = &t;
    }
    const Tensor* reference(const std::string& name) const { return find(reference_, name); }
    const Tensor* golden(const std::string& name) const { return find(golden_, name); }

private:
    static const Tensor* find(const std::unordered_map<std::string, const Tensor*>& m, const std::string& name) {
        auto it = m.find(name);
        return it == m.end() ? nullptr : it->second;
    }
    const VerifyInputs& in_;
    std::unordered_map<std::string, const Tensor*> reference_, golden_;
};

const ModuleEvent* expected_event(const RunRecord& reference, int64_t step, size_t index) {
    if (step >= static_cast<int64_t>(reference.steps.size())) return nullptr;
    const auto& events = reference.steps[step].events;
    return index < events.size() ? &events[index] : nullptr;
}

}  // namespace

// The reference is the same loop on a one-rank mesh with no plan: every redistribution is a
// no-op at world size 1, so it computes exactly the single-device training steps.
RunRecord run_reference_record(const VerifyInputs& inputs) {
    VerifyInputs in = inputs;  // the reference keeps its tensors: every plan is compared with them
    in.compare_with = nullptr, in.golden = nullptr;
    Plan single;
    single.mesh = {{"world", 1}};
    RunRecord rec;
    run_rank_threads(
        1, CommOptions{}, [&](Communicator& world) { run_parallel_rank(world, in, single, Fault{}, &rec); }, in.device);
    rec.backend = "reference";
    return rec;
}

void run_parallel_rank(Communicator& world, const VerifyInputs& in, const Plan& plan, const Fault& fault, RunRecord* out) {
    // src_data_rank null: every rank builds its own shards (an injected fault needs the full tensors)
    const bool own_shards = plan.has_tensor_parallel && !plan.src_data_rank && !in.init && fault.kind.empty();
    Model model = build_model(in, !own_shards);
    DataSource data(model, in.data, in.data_path);
    Backend& be = backend_for(in.device);  // on cuda: this rank thread's device and stream
    auto counter = std::make_shared<CommCounter>();
    DeviceMesh mesh(plan.mesh, world, counter);
    auto st = std::make_shared<TpState>();
    st->fault = fault;
    const Resolution res = resolve_plan(model, plan);
    if (own_shards) model.init_params_except([&](const Module& m) { return shards_parameters(res, m); });
    parallelize(model, plan, res, mesh, st, own_shards);
    model.to_device(in.device);  // built, initialised and TP-sharded on the host
    // DDP fills its buckets with the tensors it sees: the TP-local shards, so resolved again here
    std::vector<std::string> unused;
    const DataParallelResolution dp_res = res.dp.active ? resolve_data_parallel(model, plan, unused, unused) : res.dp;
    std::unique_ptr<DataParallel> dp;
    if (dp_res.active) dp = std::make_unique<DataParallel>(model, plan, dp_res, mesh, be, fault);
    // a dim the plan does not use is a one-rank group here, so the same code serves every plan
    std::unique_ptr<Communicator> solo_tp = st->comm ? nullptr : world.split(world.rank(), 0);
    std::unique_ptr<Communicator> solo_dp = dp ? nullptr : world.split(world.rank(), 0);
    Communicator& tp = st->comm ? *st->comm : *solo_tp;
    Communicator& dpc = dp ? dp->comm() : *solo_dp;
    const bool rank0 = world.rank() == 0;
    RunRecord rec;
    rec.init_counts = *counter;
    counter->reset();
    Optimizer optimizer(model.optimizer, be);
    const auto params = model.named_parameters();
    auto tp_placement = [&](const Parameter* p) {
        auto it = st->param_placement.find(p);
        return it == st->param_placement.end() ? Placement::replicate() : it->second;
    };
    auto dp_placement = [&](const Parameter* p) { return dp ? dp->placement(p) : Placement::replicate(); };
    // the full tensor from this rank's piece: the dp dim first (fully_shard shards the TP-local tensor)
    auto gather = [&](const Tensor& local, const Placement& on_dp, const Placement& on_tp) {
        Tensor t = on_dp.is_replicate() ? local : full_tensor(local, on_dp, global_shape(local, on_dp, dpc), dpc);
        return full_tensor(t, on_tp, global_shape(t, on_tp, tp), tp);
    };
    // under data parallel, a mean loss over each rank's rows makes activation gradients dp times
    // the reference's (DDP's average puts the parameter gradients right): scaled for comparison
    const double event_grad_scale = dpc.size() > 1 && model.loss != LossKind::sum ? 1.0 / dpc.size() : 1.0;
    {
        CountingPaused pause(counter.get());
        for (const auto& [name, p] : model.state_dict()) {
            const bool buffer = p->grad.numel() == 0 && p->value.numel() != 0;
            const Placement on_dp = buffer ? Placement::replicate() : dp_placement(p.get());
            const Placement on_tp = buffer ? Placement::replicate() : tp_placement(p.get());
            Tensor full = gather(p->value, on_dp, on_tp);
            const bool ignored = dp && dp->ignored(name);
            const bool agree = (!on_tp.is_replicate() || replicas_agree(p->value, tp)) &&
                               (ignored || !on_dp.is_replicate() || replicas_agree(p->value, dpc));
            if (rank0 && !agree) rec.init_replicas_differ.push_back(name);
            if (rank0) rec.init_state.emplace_back(name, tensor_digest(on_host(full)));
        }
    }
    rec.unique_params = static_cast<int64_t>(params.size());
    for (const auto& r : dp_res.replicas) rec.dp_buckets += static_cast<int64_t>(r.buckets.size());
    for (const auto& r : dp_res.replicas)
        for (const auto& b : r.buckets) rec.grad_bytes += b.bytes;
    const int64_t rows_per_rank = model.input.shape.empty() ? 0 : model.input.shape[0] / dpc.size();
    Expected expected(in);
    for (int64_t step = 0; step < in.steps; ++step) {
        StepRecord sr;
        sr.step = step;
        if (rank0) expected.at_step(step);
        RunContext ctx{&be, model.seed, step, true, dpc.rank() * rows_per_rank, {}};
        if (in.record_events)
            ctx.observer = [&](const Module& m, const char* phase, const Tensor& t) {
                CountingPaused pause(counter.get());
                const bool forward = std::string(phase) == "forward";
                Tensor full = gather(t, dpc.size() > 1 ? Placement::shard(0) : Placement::replicate(), forward ? st->act : st->grad);
                if (!forward && event_grad_scale != 1.0) {
                    Tensor scaled = empty_like(full);
                    be.scale(full, event_grad_scale, scaled);
                    full = scaled;
                }
                if (!rank0) return;
                if (!in.compare_with) {
                    sr.events.push_back({m.fqn(), phase, full.shares_storage(t) ? on_host(full).clone() : on_host(full), {}});
                    return;
                }
                ModuleEvent e{m.fqn(), phase, Tensor(), {}};
                const ModuleEvent* ref = expected_event(*in.compare_with, step, sr.events.size());
                if (ref && ref->fqn == e.fqn && ref->phase == e.phase) e.diff = compare_tensors(on_host(full), ref->full, in.tol);
                sr.events.push_back(std::move(e));
            };
        Batch b = data.batch(step);
        if (in.device != Device::cpu) {
            b.input = b.input.to_device(in.device);
            if (b.target.defined()) b.target = b.target.to_device(in.device);
        }
        if (dpc.size() > 1) {  // this rank's rows of the global batch
            b.input = chunk(b.input, dpc.size(), dpc.rank(), 0);
            if (b.target.defined()) b.target = chunk(b.target, dpc.size(), dpc.rank(), 0);
        }
        // timed as the reference is: from the batch on the device to the optimizer step's end
        // (the ranks' host-to-device copies of the batch are data loading: at tp=8 on an H100 they were
        // half of the gemm_mlp_4k step, 124 ms -> 61 ms without them)
        be.synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (const auto& [name, p] : params) be.fill(p->grad, 0.0);
        if (dp) dp->before_forward();
        st->act = res.input_placement;
        Tensor x = redistribute(b.input, Placement::replicate(), res.input_placement, b.input.shape(), tp);
        Tensor y = model.root->forward(ctx, x);
        Shape local_out = model.output_shape;  // this rank's rows of it under data parallel
        if (!local_out.empty()) local_out[0] /= dpc.size();
        Tensor y_full = redistribute(y, st->act, Placement::replicate(), local_out, tp);
        LossResult loss = compute_loss(be, model.loss, y_full, b.target);
        const Placement out_placement = st->act;
        Tensor dy = redistribute_backward(loss.grad, Placement::replicate(), out_placement, local_out, tp);
        st->grad = out_placement.is_partial() ? Placement::replicate() : out_placement;
        model.root->backward(ctx, dy);
        if (dp) dp->after_backward();
        optimizer.step(params);
        be.synchronize();
        sr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rec.seconds += sr.seconds;
        if (dp) rec.bucket_copy_bytes = dp->bucket_copy_bytes(), rec.bucket_allreduce_bytes = dp->bucket_allreduce_bytes();

        CountingPaused pause(counter.get());
        const std::string s = fmt::format("step{}.", step);
        const bool last_step = step + 1 == in.steps;
        auto agree = [&](const Tensor& local, const Placement& p, Communicator& comm) {
            return !p.is_replicate() || replicas_agree(local, comm);
        };
        auto record = [&](const std::string& name, const Tensor& local, const Placement& on_dp, const Placement& on_tp,
                          bool ignored = false) {
            Tensor full = gather(local, on_dp, on_tp);
            const bool tp_ok = agree(local, on_tp, tp), dp_ok = agree(local, on_dp, dpc);
            const bool has_replicas = (on_tp.is_replicate() && tp.size() > 1) || (on_dp.is_replicate() && dpc.size() > 1);
            std::string status = has_replicas ? "equal" : "-";
            if (ignored && dpc.size() > 1) status = dp_ok ? "SYNCED" : "ignored";
            if (!tp_ok || (!dp_ok && !ignored)) status = "DIFFER";
            if (!rank0) return;
            sr.replicas[name] = status;
            if (in.compare_with || in.golden) {  // compared now, kept as diffs
                const Tensor host = on_host(full);
                if (const Tensor* e = expected.reference(name)) sr.vs_reference[name] = compare_tensors(host, *e, in.tol);
                if (const Tensor* g = expected.golden(name)) sr.vs_golden[name] = compare_tensors(host, g->to(host.dtype()), in.tol);
                return;
            }
            // the last step's tensors are not written again: recorded in place, not copied
            const bool copy = full.shares_storage(local) && full.device() == Device::cpu && !last_step;
            sr.tensors.emplace_back(name, copy ? on_host(full).clone() : on_host(full));
        };
        // each rank's output rows and loss are its own: gathered and combined as the global batch's
        const Placement rows = dpc.size() > 1 ? Placement::shard(0) : Placement::replicate();
        record(s + "output", y_full, rows, Placement::replicate());
        Tensor loss_t = Tensor::scalar(loss.value, DType::float64).reshape({1});
        if (dpc.size() > 1) dpc.all_reduce(loss_t, model.loss == LossKind::sum ? ReduceOp::sum : ReduceOp::avg);
        record(s + "loss", Tensor::scalar(loss_t.item(0), model.dtype), Placement::replicate(), Placement::replicate());
        if (dpc.size() > 1 && rank0) sr.replicas[s + "loss"] = "-";  // combined from each rank's own
        for (const auto& [name, p] : params)
            record(s + "grad." + name, p->grad, dp_placement(p.get()), tp_placement(p.get()), dp && dp->ignored(name));
        for (const auto& [name, p] : params)
            record(s + "param." + name, p->value, dp_placement(p.get()), tp_placement(p.get()), dp && dp->ignored(name));
        for (const auto& [name, bf] : model.named_buffers())
            record(s + "buffer." + name, bf->value, Placement::replicate(), Placement::replicate());
        if (rank0) rec.steps.push_back(std::move(sr));
    }
    rec.step_counts = *counter;
    rec.world_size = world.size();
    rec.backend = world.backend();
    if (rank0 && out) *out = std::move(rec);
}

}  // namespace ptool
