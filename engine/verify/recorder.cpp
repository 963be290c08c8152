// Recording a run (verify/recorder.h): what is recorded when. The Recorder's other concerns are in
// recorder_*.cpp (verify/recorder_state.h lists them).
#include "verify/recorder.h"

#include <algorithm>

#include "model/batch.h"
#include "parallel/redistribute.h"
#include "verify/digest.h"
#include "verify/recorder_state.h"

namespace ptool::recording {

Recorder::Recorder(Run& run, const RecordOptions& opt)
    : run_(run),
      opt_(opt),
      rank0_(run.world().rank() == 0),
      data_(run.data_comm()),
      local_(opt.rank_local &&
             opt.compare_with) {  // a parallel run against a reference (which records whole)
    if (opt.golden)
        for (const auto& [name, t] : opt.golden->tensors) golden_[name] = &t;
    // the dims in the order a replica's chunk is numbered (shared_box): those that cut
    // parameters (tp, then the data dims), then any other
    // cutting parameters (tp, then the data dims), then any other but pp: a stage's tensors are
    // its own, held by no other stage (neither replicas nor shards over pp)
    const int pp = run.dims().index(DimRole::pp);
    for (int d : run.dims().param_nesting())
        if (d != pp) order_.push_back(d);
    for (int d = 0; d < run.dims().ndim(); ++d)
        if (d != pp && std::find(order_.begin(), order_.end(), d) == order_.end()) order_.push_back(d);
    leader_ = owns(Placements{});
    group_first_ = group_firsts(run);
    // A pipeline's init tensors would come from every stage: golden files record the one-stage
    // reference (ptool golden record, ptool run --dump), never a pipeline run.
    PTOOL_REQUIRE(run.stages() == 1 || !opt.init_tensors,
                  "a pipeline run does not record init tensors: golden files record the one-stage reference");
}

void Recorder::construction(RunRecord& rec) {
    Unaccounted pause(&run_.counter());
    if (!opt_.tensors) return;
    init_ = &rec;
    for (const auto& [name, p] : run_.model().state_dict()) {
        const bool buffer = p->grad.numel() == 0 && p->value.numel() != 0;
        const Placements pl = buffer ? Placements{} : run_.placements(p.get());
        const bool ignored = run_.ignored(name);
        const Agreement a = agreement(p->value, pl);
        const bool agree = a.model && (ignored || a.data);
        const ReplicaState state = !agree    ? ReplicaState::differ
                                   : ignored ? ReplicaState::ignored
                                             : ReplicaState::equal;
        if (rank0_) init_index_[name] = rec.init_state.size(), rec.init_state.emplace_back(name, 0);
        if ((local_ || staged()) && !pl.any_partial()) {  // the pieces' sums, added up on rank 0 (flush)
            queue_digest(name, p->value, pl, state, agree);
            continue;
        }
        const Tensor full = gather(p->value, pl);
        if (!rank0_) {  // another stage's leader hashes its whole tensor for rank 0
            if (staged() && leader_) {
                const Tensor h = on_host(full);
                std::vector<int64_t> words{
                    static_cast<int64_t>(element_hash_sum(h, h.shape(), std::vector<int64_t>(h.dim(), 0))),
                    static_cast<int64_t>(h.dtype()), agree ? 1 : 0};
                words.insert(words.end(), h.shape().begin(), h.shape().end());
                queue(Target::digest, name, std::move(words));
            }
            continue;
        }
        if (!agree) init_differ_.insert(name);
        rec.init_state[init_index_.at(name)].second = state_digest(full);
    }
    int64_t unique = 0;  // a weight tied across stages counts once, on the first that holds it
    for (const auto& [name, p] : run_.model().named_parameters()) unique += !run_.shared_copy(p.get());
    if (rank0_)
        rec.unique_params = unique;
    else if (run_.stages() > 1 && leader_)
        queue(Target::unique_params, "", {unique});
    flush(nullptr);
    if (rank0_ && !run_.model_state_names().empty()) {  // a rank's stages are not consecutive
        std::map<std::string, size_t> at;
        for (const std::string& n : run_.model_state_names()) at.emplace(n, at.size());
        std::stable_sort(rec.init_state.begin(), rec.init_state.end(), [&](const auto& a, const auto& b) {
            const auto i = at.find(a.first), j = at.find(b.first);
            return (i == at.end() ? at.size() : i->second) < (j == at.end() ? at.size() : j->second);
        });
    }
    for (const auto& [name, digest] : rec.init_state)  // in state_dict order
        if (init_differ_.count(name)) rec.init_replicas_differ.push_back(name);
    init_ = nullptr;
    if (opt_.init_tensors) {  // golden files: init.param.* then init.buffer.*, each tensor once
        for (const auto& [name, p] : run_.model().named_parameters()) {
            const Tensor full = gather(p->value, run_.placements(p.get()));
            if (rank0_) rec.init_tensors.emplace_back("init.param." + name, on_host(full).clone());
        }
        for (const auto& [name, b] : run_.model().named_buffers())
            if (rank0_) rec.init_tensors.emplace_back("init.buffer." + name, on_host(b->value).clone());
    }
    for (const auto& r : run_.resolution().dp.replicas) {
        rec.dp_buckets += static_cast<int64_t>(r.buckets.size());
        for (const auto& b : r.buckets) rec.grad_bytes += b.bytes;
    }
}

void Recorder::step(StepRecord& sr, const StepOutput& out, bool last_step) {
    Unaccounted pause(&run_.counter());
    reference_.clear();
    const StepRecord* ref_step =
        (rank0_ || local_) ? reference_step(sr.step) : nullptr;  // waits when following
    if (ref_step)
        for (const auto& [name, t] : ref_step->tensors) reference_[name] = &t;
    compare_deferred(sr, ref_step);
    const std::string s = fmt::format("step{}.", sr.step);
    if (run_.holds_last_stage()) {  // the last stage's rank (every rank without pp)
        // each rank's output rows and loss are its own: gathered and combined as the global batch's
        if (opt_.tensors) record_output(sr, s + "output", out.outputs, last_step);
        // each rank's loss: a sum (loss: sum; global_tokens: its part of the step's sum / count,
        // beside the balancing losses every such rank holds whole), or its own mean
        const bool summed = run_.model().loss == LossKind::sum || summed_loss();
        const double whole = summed ? out.aux_loss : 0;
        Tensor loss = Tensor::scalar(out.loss - whole, DType::float64).reshape({1});
        const ReduceOp combine = summed ? ReduceOp::sum : ReduceOp::avg;
        if (data_.size() > 1) data_.all_reduce(loss, combine);
        if (Communicator& cp = run_.comm(DimRole::cp); cp.size() > 1) cp.all_reduce(loss, combine);
        record(sr, s + "loss", Tensor::scalar(loss.item(0) + whole, run_.model().dtype), {}, false,
               last_step);
        if (data_.size() > 1 || run_.comm(DimRole::cp).size() > 1)
            note_state(sr, s + "loss", ReplicaState::sharded);  // combined from each rank's own
        if (run_.model().clip_grad_norm >
            0)  // what clip_grad_norm_ returns: a scale of every gradient shows here
            record(sr, s + "grad_norm", Tensor::scalar(out.grad_norm, DType::float64), {}, false, last_step);
    }
    if (!opt_.tensors) return flush(&sr);
    run_.gather_sharded_gradients();  // ZeRO-2: the full gradients from the dp ranks' shards
    const auto params = run_.model().named_parameters();
    // a weight tied across stages is recorded by the first stage that holds it; the others'
    // copies step alike from the same summed gradient (what they compute with shows downstream)
    for (size_t i = 0; i < params.size(); ++i) {
        const auto& [name, p] = params[i];
        if (run_.shared_copy(p.get())) {
            shadow_grad(i, *p, Tensor());
            continue;
        }
        shadow_grad(
            i, *p,
            record(sr, s + "grad." + name, p->grad, run_.placements(p.get()), run_.ignored(name), last_step));
    }
    shadow_step();  // what the optimizer makes of these gradients
    for (size_t i = 0; i < params.size(); ++i) {
        const auto& [name, p] = params[i];
        if (run_.shared_copy(p.get())) continue;
        shadow_compare(sr, s + "param." + name, i, *p,
                       record(sr, s + "param." + name, p->value, run_.placements(p.get()), run_.ignored(name),
                              last_step));
    }
    for (const auto& [name, b] : run_.model().named_buffers())
        record(sr, s + "buffer." + name, b->value, {}, false, last_step);
    flush(&sr);  // the step's comparisons, the module events' included
}

// Where this step's parameters differ from the truth's at all (the golden's, else the
// reference's), every rank continues from the truth's (ignored modules' excepted, which differ
// by design), and so does the shadow optimizer: each step is judged from the state both runs
// agree on. Two correct runs part by more than rounding where AdamW turns rounding-sized
// gradient differences into lr-sized steps (its update divides by sqrt(v) + eps), and where an
// ill-conditioned model (a saturated softmax) amplifies last step's rounding in the parameters;
// without this, that legitimate difference would flow into every later tensor. A step's own
// error is judged at that step, so nothing is hidden: its parameters were compared before
// they are replaced. Collective over the world.
void Recorder::resync(const StepRecord& sr) {
    const auto& truth = opt_.golden ? golden_ : reference_;
    const auto& diffs = opt_.golden ? sr.vs_golden : sr.vs_reference;
    const std::string s = fmt::format("step{}.param.", sr.step);
    const auto params = run_.model().named_parameters();
    Tensor flag = Tensor::scalar(0, DType::int64).reshape({1});
    if (rank0_)  // every stage's parameters' diffs reached rank 0 (flush)
        for (auto it = diffs.lower_bound(s); it != diffs.end() && it->first.compare(0, s.size(), s) == 0;
             ++it)
            if (!run_.ignored(it->first.substr(s.size())) && it->second.max_abs != 0 &&
                truth.count(it->first))
                flag.set(0, 1);
    Communicator& world = run_.world();
    Unaccounted pause(&run_.counter());
    world.broadcast(flag, 0);
    if (flag.item(0) == 0) return;
    if (staged() && !local_) {  // the stages hold different parameters: rank 0 sends every one
        resync_stages(s, truth);
        return;
    }
    for (size_t i = 0; i < params.size(); ++i) {
        const auto& [name, p] = params[i];
        if (run_.ignored(name)) continue;
        const Placements pl = run_.placements(p.get());
        Tensor piece;
        if (local_ && truth.count(s + name)) {  // each rank cuts its piece of the truth: no broadcast
            piece = piece_of(*truth.at(s + name), pl).to(p->value.dtype());
            PTOOL_REQUIRE(piece.shape() == p->value.shape(), "resync of '{}': {} for {}", name,
                          shape_str(piece.shape()), shape_str(p->value.shape()));
            if (!shadow_.empty()) shadow_[i].second->value = piece.clone();
        } else {  // rank 0 broadcasts the whole truth; every rank cuts its piece
            Tensor full(whole_shape(p->value.shape(), pl), p->value.dtype());
            if (rank0_) {
                const Tensor& t = *truth.at(s + name);
                PTOOL_REQUIRE(t.shape() == full.shape(), "resync of '{}': {} for {}", name,
                              shape_str(t.shape()), shape_str(full.shape()));
                full = t.to(full.dtype()).clone();
                if (!shadow_.empty()) shadow_[i].second->value = full.clone();
            }
            world.broadcast(full, 0);
            piece = piece_of(full, pl);
        }
        run_.backend().copy(p->value.device() == Device::cpu ? piece : piece.to_device(p->value.device()),
                            p->value);
    }
}

// The output: each microbatch's gathered by its layout (every dp rank holds its part of each),
// the microbatches concatenated in order, as the reference's rows are.
void Recorder::record_output(StepRecord& sr, const std::string& name, const std::vector<Placed>& outs,
                             bool last_step) {
    std::vector<Tensor> full, local;
    for (const Placed& o : outs) full.push_back(gather(o)), local.push_back(o.t);
    const Tensor whole = full.size() == 1 ? full[0] : cat(full, 0),
                 mine = local.size() == 1 ? local[0] : cat(local, 0);
    const ReplicaState state = replica_state(mine, activation_placements(outs[0]), false);
    if (staged() && !local_) {  // rank 0 compares it whole, from the last stage's leader
        send_whole(sr, name, whole, state);
        return;
    }
    if (run_.stages() > 1) {  // the last stage's leader compares it whole; rank 0 hears by key
        if (leader_) {
            const Tensor host = on_host(whole);
            const Box b{std::vector<int64_t>(host.dim(), 0), host.shape(), true, compare_threads()};
            if (auto it = reference_.find(name); it != reference_.end())
                queue_diff(Target::reference, name, piece(host, *it->second, b, rule_for(opt_.tol, name)));
            if (auto it = golden_.find(name); it != golden_.end())
                queue_diff(Target::golden, name, piece(host, *it->second, b, rule_for(opt_.tol, name)));
        }
        note_state(sr, name, state);
        return;
    }
    keep(sr, name, mine, whole, state, last_step);
}

// Returns the full tensor on the host (rank 0); rank-locally, nothing.
Tensor Recorder::record(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl,
                        bool ignored, bool last_step) {
    if (local_ && !pl.any_partial()) {
        keep_local(sr, name, local, pl, replica_state(local, pl, ignored));
        return {};
    }
    const Tensor full = gather(local, pl);
    const ReplicaState state = replica_state(local, pl, ignored);
    if (!rank0_ && staged()) {  // rank 0 compares it whole, from its stage's leader
        send_whole(sr, name, full, state);
        return {};
    }
    return keep(sr, name, local, full, state, last_step);
}

Tensor Recorder::keep(StepRecord& sr, const std::string& name, const Tensor& local, const Tensor& full,
                      ReplicaState state, bool last_step) {
    if (!rank0_) return {};
    sr.replicas[name] = state;
    if (opt_.compare_with || opt_.golden) {  // compared now; a parallel run keeps the diffs only
        const Tensor host = on_host(full);
        const Tolerance tol = rule_for(opt_.tol, name);
        if (auto it = reference_.find(name); it != reference_.end())
            sr.vs_reference[name] = compare_tensors(host, *it->second, tol);
        if (auto it = golden_.find(name); it != golden_.end())
            sr.vs_golden[name] = compare_tensors(host, it->second->to(host.dtype()), tol);
        if (opt_.compare_with) return host;
    }
    // the last step's tensors are not written again: recorded in place, not copied
    const bool copy = full.shares_storage(local) && full.device() == Device::cpu && !last_step;
    sr.tensors.emplace_back(name, copy ? on_host(full).clone() : on_host(full));
    return sr.tensors.back().second;
}

// A parameter's or gradient's piece compared where it lies (rank-local).
void Recorder::keep_local(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl,
                          ReplicaState state) {
    const Tensor mine = on_host(local);
    const Tolerance tol = rule_for(opt_.tol, name);
    if (auto it = reference_.find(name); it != reference_.end())
        queue_diff(Target::reference, name,
                   piece(mine, *it->second, shared_box(it->second->shape(), pl, state), tol));
    if (auto it = golden_.find(name); it != golden_.end())
        queue_diff(Target::golden, name,
                   piece(mine, *it->second, shared_box(it->second->shape(), pl, state), tol));
    note_state(sr, name, state);
}

}  // namespace ptool::recording

namespace ptool {

using recording::Recorder;
using recording::Unaccounted;

RunRecord record_run(Run& run, int64_t steps, const RecordOptions& opt) {
    Recorder recorder(run, opt);
    RunRecord own;
    RunRecord& rec = opt.publish ? opt.publish->record : own;  // published steps never move: reserved
    const bool rank0 = run.world().rank() == 0;
    if (rank0 && opt.publish) rec.steps.reserve(static_cast<size_t>(steps));
    rec.init_counts = run.counter();  // the construction's collectives (src_data_rank)
    run.counter().reset();
    recorder.construction(rec);
    recorder.start_shadow();
    for (int64_t k = 0; k < steps; ++k) {
        if (opt.publish)
            opt.publish->wait_for_room(k);  // at most two steps ahead of the ranks; throws once cancelled
        StepRecord sr;
        sr.step = k;
        if (run.model().clip_grad_norm > 0)  // the gradients' copies, before the clip scales them
            run.set_action_observer([&](const std::vector<Action>& actions, bool done) {
                if (!done && actions.size() == 1 && actions[0].kind == ActionKind::clip)
                    recorder.before_clip(sr);
            });
        StepOutput out = run.step(k, recorder.observer(sr));
        run.set_action_observer(nullptr);
        if (opt.rank_local && run.world().size() > 1) {
            Unaccounted pause(&run.counter());
            out.seconds = world_step_seconds(run.world(), out.started, out.seconds);
        }
        sr.seconds = out.seconds;
        rec.seconds += out.seconds;
        if (const DataParallel* dp = run.data_parallel())
            rec.bucket_copy_bytes = dp->bucket_copy_bytes(),
            rec.bucket_allreduce_bytes = dp->bucket_allreduce_bytes();
        recorder.step(sr, out, k + 1 == steps);
        if (opt.resync && k + 1 < steps) recorder.resync(sr);
        if (opt.done_with_reference_step) {  // every rank has read the reference's step k
            Unaccounted pause(&run.counter());
            run.world().barrier();
            if (rank0) opt.done_with_reference_step(k);
        }
        if (rank0 && opt.on_step) opt.on_step(k, out.loss, out.seconds);
        if (rank0) rec.steps.push_back(std::move(sr));
        if (rank0 && opt.publish) opt.publish->publish(&rec.steps.back());
    }
    rec.step_counts = run.counter();
    rec.world_size = run.world().size();
    rec.backend = run.world().backend();
    return rank0 && !opt.publish ? rec : RunRecord{};
}

double world_step_seconds(Communicator& world, double started, double seconds) {
    Tensor mine({2}, DType::float64), all({2 * world.size()}, DType::float64);
    mine.data<double>()[0] = started, mine.data<double>()[1] = started + seconds;
    world.all_gather(mine, all);
    double first = all.data<double>()[0], last = all.data<double>()[1];
    for (int r = 1; r < world.size(); ++r)
        first = std::min(first, all.data<double>()[2 * r]),
        last = std::max(last, all.data<double>()[2 * r + 1]);
    return last - first;
}

}  // namespace ptool
