#include "verify/recorder.h"

#include <algorithm>
#include <optional>
#include <set>
#include <unordered_map>

#include "comm/dim_collectives.h"
#include "core/tensor_ops.h"
#include "model/batch.h"
#include "model/optimizer.h"
#include "parallel/redistribute.h"
#include "verify/digest.h"
#include "verify/keyed_gather.h"

namespace ptool {
namespace {

Tensor on_host(const Tensor& t) {
    return t.device() == Device::cpu ? t : t.to_device(Device::cpu);
}

// The full size of dim `p.dim` from every rank's local size (uncounted metadata); an Owned tensor's
// whole shape from its owner.
Shape global_shape(const Shape& local, const Placement& p, Communicator& comm) {
    if (p.is_owned() && comm.size() > 1) {
        Tensor dims({static_cast<int64_t>(local.size())}, DType::int64);
        for (size_t i = 0; i < local.size(); ++i)
            dims.set(static_cast<int64_t>(i), static_cast<double>(local[i]));
        comm.broadcast(dims, static_cast<int>(p.dim));
        Shape g(local.size());
        for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<int64_t>(dims.item(static_cast<int64_t>(i)));
        return g;
    }
    if (!p.is_shard() || comm.size() == 1) return local;
    const int64_t d = p.normalized(static_cast<int64_t>(local.size())).dim;
    Tensor mine = Tensor::scalar(static_cast<double>(local[d]), DType::int64).reshape({1});
    Tensor all({comm.size()}, DType::int64);
    comm.all_gather(mine, all);
    Shape g = local;
    g[d] = 0;
    for (int r = 0; r < comm.size(); ++r) g[d] += static_cast<int64_t>(all.item(r));
    return g;
}

// Verification's own work inside a run (gathers, comparisons, the shadow optimizer): neither its
// collectives nor its tensors are the plan's, so neither is counted.
struct Unaccounted {
    CountingPaused comm;
    MemoryScope memory;
    explicit Unaccounted(CommCounter* c) : comm(c), memory(nullptr) {}
};

// A full tensor's digest, as the pieces of a sharded one add up to it (verify/digest.h).
uint64_t state_digest(const Tensor& full) {
    const Tensor h = on_host(full);
    return finish_element_hash(element_hash_sum(h, h.shape(), std::vector<int64_t>(h.shape().size(), 0)),
                               h.dtype(), h.shape());
}

// Where this rank's piece of a tensor sits in the whole one: the box at `offset` of `shape`, and
// whether this rank counts it (one rank of each group of replicas does, or each its rows of it).
struct Box {
    std::vector<int64_t> offset;
    Shape shape;
    bool owner = true;
    int threads = 1;    // compare_piece's: more where one rank compares a replicated tensor alone
    Chunk rows{0, -1};  // the rows (dim 0) of the piece this rank compares; length -1: all
    // The part of this rank's piece it compares (its rows, or all of it) and where it starts in the whole
    Tensor part(const Tensor& piece) const {
        return rows.length < 0 ? piece : piece.narrow(0, rows.offset, rows.length);
    }
    std::vector<int64_t> part_offset() const {
        std::vector<int64_t> at = offset;
        if (rows.length >= 0) at[0] += rows.offset;
        return at;
    }
};

class Recorder {
public:
    Recorder(Run& run, const RecordOptions& opt)
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
        PTOOL_REQUIRE(
            run.stages() == 1 || !opt.init_tensors,
            "a pipeline run does not record init tensors: golden files record the one-stage reference");
    }

    // The shadow optimizer (rank 0, compared runs, AdamW): the model's optimizer stepping full-size
    // copies of the parameters with the gradients this run recorded, so each step's parameters can
    // be checked against what the optimizer makes of the run's own gradients (verify/report.cpp).
    void start_shadow() {  // collective: every rank gathers, rank 0 keeps
        // AdamW amplifies rounding-sized gradient differences; under mixed precision every update
        // carries the compute dtype's into the full-precision masters
        if (!opt_.shadow_optimizer ||
            (run_.model().optimizer.type != OptimizerType::adamw && !opt_.tol.masters))
            return;
        Unaccounted pause(&run_.counter());
        if (piecewise_shadow()) {  // each rank steps its own pieces: the optimizer is elementwise
            for (const auto& [name, p] : run_.model().named_parameters()) {
                auto s = std::make_shared<Parameter>();
                s->value = on_host(p->value).clone();
                shadow_.emplace_back(name, s);
            }
            shadow_opt_ = std::make_unique<Optimizer>(run_.model().optimizer, backend_for(Device::cpu));
            return;
        }
        for (const auto& [name, p] : run_.model().named_parameters()) {
            const Tensor full = gather(p->value, run_.placements(p.get()));
            if (!rank0_) continue;
            auto s = std::make_shared<Parameter>();
            s->value = on_host(full).clone();
            shadow_.emplace_back(name, s);
        }
        if (rank0_)
            shadow_opt_ = std::make_unique<Optimizer>(run_.model().optimizer, backend_for(Device::cpu));
    }

    // A parameter's full tensor from this rank's piece: the innermost cut first (fully_shard's
    // rows of the tp piece, then the tp piece).
    Tensor gather(const Tensor& local, const Placements& pl) {
        Tensor t = local;
        for (auto it = pl.nested.rbegin(); it != pl.nested.rend(); ++it) {
            Communicator& c = run_.comm(it->mesh_dim);
            const Shape whole = global_shape(t.shape(), it->p, c);
            if (it->p.is_owned()) {  // the owner's, to every rank of the dim
                Tensor w = c.rank() == it->p.dim ? t.clone() : Tensor(whole, t.dtype(), t.device());
                if (c.size() > 1) c.broadcast(w, static_cast<int>(it->p.dim));
                t = w;
            } else {
                t = full_tensor(t, it->p, whole, c);
            }
        }
        return t;
    }

    // An activation's: whole on the tp dim by its layout, then every cp rank's positions (in
    // position order), then every data rank's rows.
    Tensor gather(const Placed& x) {
        Tensor t = full_tensor(x.t, x.p, x.global, tp());
        if (const ContextShard* cp = context()) {
            Shape whole = t.shape();
            whole[1] = cp->seq;
            t = cp->natural(all_gather_dim(t, 1, whole, *cp->comm), 1);
        }
        return data_.size() > 1 ? full_tensor(t, Placement::shard(0),
                                              global_shape(t.shape(), Placement::shard(0), data_), data_)
                                : t;
    }

    void construction(RunRecord& rec) {
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
                    std::vector<int64_t> words{static_cast<int64_t>(element_hash_sum(
                                                   h, h.shape(), std::vector<int64_t>(h.dim(), 0))),
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

    StepObserver observer(StepRecord& sr) {
        if (!opt_.events) return nullptr;
        // under data parallel a mean loss over each rank's rows makes activation gradients dp times
        // the reference's (DDP's average puts the parameter gradients right): scaled for comparison
        // (and under context parallel a mean over each rank's positions: cp times); under
        // global_tokens every rank divides by the step's count, as the reference does
        const int ranks = data_.size() * run_.comm(DimRole::cp).size();
        const bool per_rank_mean = run_.model().loss != LossKind::sum && !summed_loss();
        const double scale = ranks > 1 && per_rank_mean ? 1.0 / ranks : 1.0;
        auto calls =
            std::make_shared<std::map<std::string, int>>();  // this step's events so far, by key less call
        event_index_.clear();
        return [this, &sr, scale, calls](const std::string& fqn, Phase phase, int microbatch,
                                         const Placed& x) {
            Unaccounted pause(&run_.counter());
            ModuleEvent e{fqn, phase, microbatch, 0, Tensor(), {}};
            e.call = (*calls)[fmt::format("{}:{}:{}", microbatch, static_cast<int>(phase), e.fqn)]++;
            const std::string key = event_key(e);
            auto as_reference = [&](const Tensor& t) {  // a backward event at the reference's scale
                if (phase != Phase::backward || scale == 1.0) return t;
                Tensor scaled = empty_like(t);
                backend_for(t.device()).scale(t, scale, scaled);
                return scaled;
            };
            if (local_ && !x.p.is_partial()) {
                if (opt_.follow) {  // compared at the step's end, once the reference published it
                    Tensor mine;
                    if (activation_box(x.global, x).owner) {
                        mine = as_reference(on_host(x.t));
                        if (mine.shares_storage(x.t)) mine = mine.clone();
                    }
                    deferred_.push_back({key, Placed{mine, x.p, x.global}, x.t.shape(), true});
                } else if (const ModuleEvent* ref = reference_event(sr.step, key);
                           ref && ref->full.defined()) {
                    const Tensor mine = as_reference(on_host(x.t));
                    queue_diff(
                        Target::event, key,
                        piece(mine, in_cp_order(ref->full), activation_box(ref->full.shape(), x), opt_.tol));
                }
                if (rank0_) add_event(sr, std::move(e));
                return;
            }
            const Tensor full = as_reference(gather(x));
            if (!rank0_) {  // another stage's: its leader sends it whole to rank 0 (flush)
                if (staged() && leader_) queue(Target::event_tensor, key, tensor_words(on_host(full)));
                return;
            }
            if (!opt_.compare_with) {
                e.full = full.shares_storage(x.t) ? on_host(full).clone() : on_host(full);
            } else if (opt_.follow) {
                const Tensor kept = full.shares_storage(x.t) ? on_host(full).clone() : on_host(full);
                deferred_.push_back({key, Placed{kept, x.p, x.global}, kept.shape(), false});
            } else if (const ModuleEvent* ref = reference_event(sr.step, key)) {
                e.diff = compare_tensors(on_host(full), ref->full, opt_.tol);
            }
            add_event(sr, std::move(e));
        };
    }

    void step(StepRecord& sr, const StepOutput& out, bool last_step) {
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
                record(sr, s + "grad_norm", Tensor::scalar(out.grad_norm, DType::float64), {}, false,
                       last_step);
        }
        if (!opt_.tensors) return flush(&sr);
        run_.gather_sharded_gradients();  // ZeRO-2: the full gradients from the dp ranks' shards
        const auto params = run_.model().named_parameters();
        // a weight tied across stages is recorded by the first stage that holds it; the others'
        // copies step alike from the same summed gradient (what they compute with shows downstream)
        for (size_t i = 0; i < params.size(); ++i) {
            const auto& [name, p] = params[i];
            if (run_.shared_copy(p.get())) {
                if (!shadow_.empty()) shadow_[i].second->grad = on_host(p->grad).clone();
                continue;
            }
            const Tensor g = record(sr, s + "grad." + name, p->grad, run_.placements(p.get()),
                                    run_.ignored(name), last_step);
            if (!shadow_.empty())
                shadow_[i].second->grad = piecewise_shadow() ? on_host(p->grad).clone() : g.clone();
        }
        if (!shadow_.empty()) shadow_opt_->step(shadow_);  // what the optimizer makes of these gradients
        for (size_t i = 0; i < params.size(); ++i) {
            const auto& [name, p] = params[i];
            if (run_.shared_copy(p.get())) continue;
            const Tensor v = record(sr, s + "param." + name, p->value, run_.placements(p.get()),
                                    run_.ignored(name), last_step);
            if (shadow_.empty()) continue;
            if (piecewise_shadow()) {  // this rank's piece against its shadow piece, counted once per group
                                       // of replicas
                const Placements pl = run_.placements(p.get());
                const Box b{std::vector<int64_t>(p->value.dim(), 0), p->value.shape(), owns(pl), threads(pl)};
                queue_diff(Target::shadow, s + "param." + name,
                           piece(on_host(p->value), shadow_[i].second->value, b, opt_.tol.for_masters()));
            } else if (rank0_) {
                sr.vs_shadow[s + "param." + name] =
                    compare_tensors(v, shadow_[i].second->value, opt_.tol.for_masters());
            }
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
    void resync(const StepRecord& sr) {
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

private:
    Communicator& tp() const { return run_.comm(DimRole::tp); }

    // A pipeline run (its stages hold different tensors): what rank 0 compares whole reaches it from
    // each stage's leader at the flush (verify/keyed_gather.h), and the shadow optimizer steps
    // each rank's own pieces.
    bool staged() const { return run_.stages() > 1; }
    bool piecewise_shadow() const { return local_ || staged(); }

    // resync for a pipeline whose truth is rank 0's (mpirun): rank 0 broadcasts the step's
    // parameters of the truth by name (every stage's, the ignored modules' excepted), and each rank
    // cuts its pieces of its own. Collective over the world.
    void resync_stages(const std::string& prefix,
                       const std::unordered_map<std::string, const Tensor*>& truth) {
        std::vector<KeyedEntry> sent;
        if (rank0_) {
            std::vector<std::string> names;  // in name order: what travels does not follow a hash's order
            for (const auto& [name, t] : truth)
                if (name.compare(0, prefix.size(), prefix) == 0 && !run_.ignored(name.substr(prefix.size())))
                    names.push_back(name);
            std::sort(names.begin(), names.end());
            for (const std::string& name : names)
                sent.push_back({name, tensor_words(on_host(*truth.at(name))), 0});
        }
        std::unordered_map<std::string, Tensor> whole;
        for (const KeyedEntry& e : broadcast_keyed(run_.world(), sent))
            whole.emplace(e.key, tensor_from_words(e.words.data(), e.words.size()));
        const auto params = run_.model().named_parameters();
        for (size_t i = 0; i < params.size(); ++i) {
            const auto& [name, p] = params[i];
            if (run_.ignored(name)) continue;
            auto it = whole.find(prefix + name);
            PTOOL_REQUIRE(it != whole.end(), "resync of '{}': the truth has no {}", name, prefix + name);
            const Placements pl = run_.placements(p.get());
            const Tensor piece = piece_of(it->second, pl).to(p->value.dtype());
            PTOOL_REQUIRE(piece.shape() == p->value.shape(), "resync of '{}': {} for {}", name,
                          shape_str(piece.shape()), shape_str(p->value.shape()));
            if (!shadow_.empty()) shadow_[i].second->value = piece.clone();
            run_.backend().copy(p->value.device() == Device::cpu ? piece : piece.to_device(p->value.device()),
                                p->value);
        }
    }

    // The whole tensor's shape from this rank's piece's (uncounted metadata on each cutting dim).
    Shape whole_shape(const Shape& local, const Placements& pl) const {
        Shape s = local;
        for (auto it = pl.nested.rbegin(); it != pl.nested.rend(); ++it)
            s = global_shape(s, it->p, run_.comm(it->mesh_dim));
        return s;
    }

    // Where this rank's piece of a tensor of `whole` shape placed as `pl` sits: each cutting dim's
    // chunk of what the dims outside it left (the tp piece, then fully_shard's rows of it).
    Box box_of(const Shape& whole, const Placements& pl) const {
        Box b{std::vector<int64_t>(whole.size(), 0), whole, owns(pl), threads(pl)};
        for (const Placements::On& o : pl.nested) {
            const Communicator& c = run_.comm(o.mesh_dim);
            if (o.p.is_owned() && c.rank() != o.p.dim && !b.shape.empty()) b.shape[0] = 0;
            if (!o.p.is_shard()) continue;
            const int64_t d = o.p.normalized(static_cast<int64_t>(whole.size())).dim;
            const Chunk ch = chunk_of(b.shape[d], c.size(), c.rank());
            b.offset[d] += ch.offset, b.shape[d] = ch.length;
        }
        return b;
    }

    // Whether this rank counts its piece: one rank of each group of replicas (coordinate 0 on the
    // dims the tensor is not sharded over), in each pipeline stage.
    bool owns(const Placements& pl) const {
        for (int d : order_)  // every dim but pp: each stage owns its own tensors
            if (!pl.on(d).splits() && run_.comm(d).rank() != 0) return false;
        return true;
    }
    // compare_piece's threads: all a comparison takes where this rank is the only one comparing a
    // piece of the tensor (the other ranks wait), else its own
    int threads(const Placements& pl) const { return owns(pl) && !pl.any_shard() ? compare_threads() : 1; }

    // box_of's box, compared by every replica that holds it bitwise (`state`, known on every rank
    // after replica_state): each compares its chunk of the box's rows instead of one comparing it
    // whole while the others wait. The copies are bitwise the same and the pieces' sums exact, so
    // the numbers are those of comparing one copy whole; replicas that differ are not split (the
    // coordinate-0 copy is compared whole, as box_of's). Replicas over the data dims differ by
    // design under an ignored module; those over the others never.
    Box shared_box(const Shape& whole, const Placements& pl, ReplicaState state) const {
        Box b = box_of(whole, pl);
        const bool model_agree =
            state == ReplicaState::equal || state == ReplicaState::synced || state == ReplicaState::ignored;
        const bool data_agree = state == ReplicaState::equal || state == ReplicaState::synced;
        int parts = 1, index = 0;
        bool owner = true;
        for (int d : order_) {
            const Communicator& c = run_.comm(d);
            if (!pl.on(d).is_replicate() || c.size() == 1) continue;
            if (run_.dims().is_data_dim(d) ? data_agree : model_agree)
                index = index * c.size() + c.rank(), parts *= c.size();
            else
                owner = owner && c.rank() == 0;
        }
        if (parts == 1 || b.shape.empty()) return b;  // a scalar stays with its coordinate-0 copy
        b.owner = owner;
        b.rows = chunk_of(b.shape[0], parts, index);
        b.threads = std::max(1, compare_threads() / parts);
        return b;
    }

    // This rank's piece of a whole tensor, as box_of describes it.
    Tensor piece_of(const Tensor& whole, const Placements& pl) const {
        Tensor piece = whole;
        for (const Placements::On& o : pl.nested) {
            const Communicator& c = run_.comm(o.mesh_dim);
            if (o.p.is_owned() && c.rank() != o.p.dim) piece = piece.narrow(0, 0, 0);
            if (!o.p.is_shard()) continue;
            piece = chunk(piece, c.size(), c.rank(), o.p.normalized(piece.dim()).dim);
        }
        return piece;
    }

    // The whole tensor's state digest from the pieces: each owner hashes its piece where it sits,
    // rank 0 adds the sums at the flush (verify/digest.h). Replicas that agree (`state`) hash
    // their chunks of the rows (shared_box). Words: the sum, the dtype, whether the replicas
    // agree, the whole shape.
    void queue_digest(const std::string& name, const Tensor& local, const Placements& pl, ReplicaState state,
                      bool agree) {
        const Shape whole = whole_shape(local.shape(), pl);
        const Box b = shared_box(whole, pl, state);
        std::vector<int64_t> words{
            b.owner ? static_cast<int64_t>(element_hash_sum(b.part(on_host(local)), whole, b.part_offset()))
                    : 0,
            static_cast<int64_t>(local.dtype()), agree ? 1 : 0};
        words.insert(words.end(), whole.begin(), whole.end());
        queue(Target::digest, name, std::move(words));
    }

    // An activation's placements: every data rank's rows (the data dims flattened), then each cp
    // rank's positions (a whole tensor taken in cp order: in_cp_order), then its layout on the tp
    // dim (x.global: this data and cp rank's).
    Placements activation_placements(const Placed& x) const {
        Placements pl;
        for (int d : run_.dims().data_dims()) pl.then(d, Placement::shard(0));
        if (context()) pl.then(run_.dims().index(DimRole::cp), Placement::shard(1));
        if (run_.dims().has(DimRole::tp)) pl.then(run_.dims().index(DimRole::tp), x.p);
        return pl;
    }

    const ContextShard* context() const {
        const ContextShard* cp = run_.context();
        return cp && cp->parts > 1 ? cp : nullptr;
    }

    // A whole activation (the reference's, in position order) in cp order: each cp rank's
    // positions are then its Shard(1) chunk (model/context_shard.h). Itself without load balancing.
    Tensor in_cp_order(const Tensor& whole) const {
        const ContextShard* cp = context();
        return cp && cp->load_balance && whole.dim() > 1 ? cp->cp_ordered(whole, 1) : whole;
    }

    // An activation's box: every data rank's rows, then its layout on the tp dim.
    Box activation_box(const Shape& whole, const Placed& x) const {
        if (whole.empty()) return Box{{}, whole, true};
        Box b = box_of(whole, activation_placements(x));
        b.threads = 1;
        return b;
    }

    // This rank's part of a comparison: its piece (its rows of it) against the box of the whole
    // expected tensor (a piece of another shape than its box fails on every rank that holds one).
    static DiffPiece piece(const Tensor& mine, const Tensor& expected, const Box& b, const Tolerance& tol) {
        if (mine.shape() != b.shape) return bad_shape();
        return b.owner ? compare_piece(b.part(mine), expected, b.part_offset(), tol, b.threads) : DiffPiece{};
    }

    static DiffPiece bad_shape() {
        DiffPiece bad;
        bad.counted = true, bad.d.shape_ok = bad.d.pass = false;
        return bad;
    }

    // What rank 0 hears from the ranks, by key (verify/keyed_gather.h): queued, the step's entries
    // travel together at its end (flush), not one collective each (eight rank threads taking turns
    // on two cores spent a third of a verify's comparison phase handing the cores round for them).
    // Ranks may queue different lists (pipeline stages hold different tensors): rank 0 merges by
    // key, in rank order, and the key says where the result goes.
    enum class Target {
        reference,      // a piece of a comparison with the reference's tensor: vs_reference[name]
        golden,         // ... with the golden file's: vs_golden[name]
        shadow,         // ... with the shadow optimizer's parameter: vs_shadow[name]
        event,          // ... with the reference's module event: the event keyed `name`
        state,          // a tensor's ReplicaState (from its stage's leader): replicas[name]
        digest,         // a piece's state digest sum (construction): init_state[name]
        unique_params,  // a stage's count of unique parameters (construction)
        tensor,         // another stage's whole tensor and its ReplicaState, compared by rank 0 (mpirun)
        event_tensor,   // another stage's whole module event, compared by rank 0 (mpirun)
    };
    void queue(Target t, const std::string& name, std::vector<int64_t> words) {
        queue_.push_back({fmt::format("{}|{}", static_cast<int>(t), name), std::move(words), 0});
    }
    void queue_diff(Target t, const std::string& name, const DiffPiece& piece) {
        std::vector<int64_t> words(kPieceWords);
        pack_piece(piece, words.data());
        queue(t, name, std::move(words));
    }
    Tolerance tolerance(Target t, const std::string& name) const {
        return t == Target::shadow  ? opt_.tol.for_masters()
               : t == Target::event ? opt_.tol
                                    : rule_for(opt_.tol, name);
    }

    // A tensor's replica state, on rank 0: its own, or (pipeline) heard from the stage's leader.
    void note_state(StepRecord& sr, const std::string& name, ReplicaState state) {
        if (rank0_)
            sr.replicas[name] = state;
        else if (run_.stages() > 1 && leader_)
            queue(Target::state, name, {static_cast<int64_t>(state)});
    }

    // Collective over the world: rank 0 merges every rank's queued entries by key and puts each
    // result where its key says (sr: the step's; null: construction's, into init_).
    void flush(StepRecord* sr) {
        // whole tensors go to rank 0 alone (p2p); pieces' sums to every rank, all at once
        std::vector<KeyedEntry> entries = staged() && !local_ ? gather_keyed_to_root(run_.world(), queue_)
                                                              : gather_keyed(run_.world(), queue_);
        queue_.clear();
        if (!rank0_) return;
        struct Merged {
            Target target;
            std::string name;
            DiffPiece piece;
            uint64_t hash = 0;
            std::vector<int64_t> words;  // the first entry's
            bool differ = false;
        };
        std::vector<Merged> merged;
        std::unordered_map<std::string, size_t> at;
        for (KeyedEntry& e : entries) {
            auto [it, fresh] = at.emplace(e.key, merged.size());
            if (fresh) {
                const size_t bar = e.key.find('|');
                merged.push_back({static_cast<Target>(std::stoi(e.key.substr(0, bar))),
                                  e.key.substr(bar + 1),
                                  {},
                                  0,
                                  {},
                                  false});
                Merged& m = merged.back();
                if (m.target == Target::tensor || m.target == Target::event_tensor) {
                    m.words = std::move(e.words);  // one stage's leader sends each
                    continue;
                }
                m.words = e.words;
            }
            Merged& m = merged[it->second];
            switch (m.target) {
                case Target::digest:
                    m.hash += static_cast<uint64_t>(e.words[0]), m.differ = m.differ || e.words[2] == 0;
                    break;
                case Target::unique_params:
                    init_->unique_params += e.words[0];
                    break;
                case Target::state:  // noted again (the loss: combined from each data rank's own): the last
                    m.words = e.words;
                    break;
                case Target::tensor:
                case Target::event_tensor:
                    PTOOL_REQUIRE(false, "'{}' sent to rank 0 twice", e.key);
                    break;
                default:
                    merge_piece(m.piece, unpack_piece(e.words.data()));
            }
        }
        for (Merged& m : merged) {
            switch (m.target) {
                case Target::reference:
                    sr->vs_reference[m.name] = finish_diff(m.piece, tolerance(m.target, m.name));
                    break;
                case Target::golden:
                    sr->vs_golden[m.name] = finish_diff(m.piece, tolerance(m.target, m.name));
                    break;
                case Target::shadow:
                    sr->vs_shadow[m.name] = finish_diff(m.piece, tolerance(m.target, m.name));
                    break;
                case Target::event:
                    event_of(*sr, m.name).diff = finish_diff(m.piece, tolerance(m.target, m.name));
                    break;
                case Target::state:
                    sr->replicas[m.name] = static_cast<ReplicaState>(m.words[0]);
                    break;
                case Target::digest: {
                    auto it = init_index_.find(m.name);
                    if (it == init_index_.end())  // another stage's
                        it = init_index_.emplace(m.name, init_->init_state.size()).first,
                        init_->init_state.emplace_back(m.name, 0);
                    const Shape whole(m.words.begin() + 3, m.words.end());
                    init_->init_state[it->second].second =
                        finish_element_hash(m.hash, static_cast<DType>(m.words[1]), whole);
                    if (m.differ) init_differ_.insert(m.name);
                    break;
                }
                case Target::unique_params:
                    break;
                case Target::tensor:
                    keep(*sr, m.name, Tensor(), tensor_from_words(m.words.data() + 1, m.words.size() - 1),
                         static_cast<ReplicaState>(m.words[0]), false);
                    break;
                case Target::event_tensor: {
                    const Tensor full = tensor_from_words(m.words.data(), m.words.size());
                    ModuleEvent& e = event_of(*sr, m.name);
                    if (!opt_.compare_with)
                        e.full = full;
                    else if (const ModuleEvent* ref = reference_event(sr->step, m.name))
                        e.diff = compare_tensors(full, ref->full, opt_.tol);
                    break;
                }
            }
            std::vector<int64_t>().swap(m.words);  // a whole tensor's words, done with
        }
    }

    // Rank 0's event of that key in the step: its own, or (another stage's) one made from the key.
    void add_event(StepRecord& sr, ModuleEvent e) {
        event_index_[event_key(e)] = sr.events.size();
        sr.events.push_back(std::move(e));
    }
    ModuleEvent& event_of(StepRecord& sr, const std::string& key) {
        if (auto it = event_index_.find(key); it != event_index_.end()) return sr.events[it->second];
        ModuleEvent e;  // MICROBATCH:PHASE:CALL:FQN
        size_t a = key.find(':'), b = key.find(':', a + 1), c = key.find(':', b + 1);
        e.microbatch = std::stoi(key.substr(0, a)),
        e.phase = static_cast<Phase>(std::stoi(key.substr(a + 1, b - a - 1)));
        e.call = std::stoi(key.substr(b + 1, c - b - 1)), e.fqn = key.substr(c + 1);
        add_event(sr, std::move(e));
        return sr.events.back();
    }

    // A parameter's or gradient's piece compared where it lies (rank-local).
    void keep_local(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl,
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

    // The reference's step (null: none, or no reference); following one recorded beside this
    // run, it waits until that step is published.
    const StepRecord* reference_step(int64_t step) const {
        if (!opt_.compare_with) return nullptr;
        if (opt_.follow) return opt_.follow->step(step);
        const RunRecord& ref = *opt_.compare_with;
        return step < static_cast<int64_t>(ref.steps.size()) ? &ref.steps[step] : nullptr;
    }

    // The reference's event of that key in the step (null: none).
    const ModuleEvent* reference_event(int64_t step, const std::string& key) {
        const StepRecord* ref = reference_step(step);
        if (!ref) return nullptr;
        if (ref != ref_events_of_) {
            ref_events_.clear(), ref_events_of_ = ref;
            for (const ModuleEvent& e : ref->events) ref_events_.emplace(event_key(e), &e);
        }
        auto it = ref_events_.find(key);
        return it == ref_events_.end() ? nullptr : it->second;
    }

    // The step's module events kept while following the reference, compared now in the order they
    // were recorded: rank-local ones collectively (every rank kept the same list), gathered ones
    // on rank 0; the numbers are what comparing them inside the step gives.
    void compare_deferred(StepRecord& sr, const StepRecord* ref_step) {
        for (const Deferred& d : deferred_) {
            const ModuleEvent* ref = ref_step ? reference_event(sr.step, d.key) : nullptr;
            if (!d.local) {
                if (ref) event_of(sr, d.key).diff = compare_tensors(d.x.t, ref->full, opt_.tol);
                continue;
            }
            if (!ref || !ref->full.defined()) continue;
            const Box b = activation_box(ref->full.shape(), d.x);
            queue_diff(Target::event, d.key,
                       d.shape != b.shape ? bad_shape()
                       : b.owner          ? piece(d.x.t, in_cp_order(ref->full), b, opt_.tol)
                                          : DiffPiece{});
        }
        deferred_.clear();
    }

    // Whether a tensor's replicas agree bitwise, over the data dims and over the others: every
    // group of replicas on each dim it is replicated on, not only rank 0's (on a 2 x 2 HSDP mesh
    // ranks 1 and 3 are a dp_replicate group rank 0 is not in). One all_gather of every stage
    // rank's digest; each rank then checks each rank's copy against its group's coordinate-0 copy,
    // so every rank knows the same verdict (collective over the stage, whatever the result).
    struct Agreement {
        bool model = true, data = true;
        bool replicas = false;  // replicated over some dim of more than one rank
    };
    Agreement agreement(const Tensor& local, const Placements& pl) {
        Agreement a;
        std::vector<int> dims;  // the replicated dims
        for (int d : order_)
            if (pl.on(d).is_replicate() && run_.comm(d).size() > 1) dims.push_back(d);
        if (dims.empty()) return a;
        a.replicas = true;
        Communicator& stage = run_.stage_comm();
        Tensor mine({1}, DType::int64), all({stage.size()}, DType::int64);
        mine.data<int64_t>()[0] = static_cast<int64_t>(tensor_digest(on_host(local)));
        stage.all_gather(mine, all);
        for (int d : dims) {
            const std::vector<int>& first = group_first_.at(d);
            bool ok = true;
            for (int r = 0; r < stage.size() && ok; ++r)
                ok = all.data<int64_t>()[r] == all.data<int64_t>()[first[r]];
            (run_.dims().is_data_dim(d) ? a.data : a.model) &= ok;
        }
        return a;
    }

    // Per mesh dim but pp: each stage rank's group's coordinate-0 rank on that dim (agreement's
    // reference copy), computed once.
    static std::map<int, std::vector<int>> group_firsts(const Run& run) {
        std::map<int, std::vector<int>> out;
        const std::vector<MeshDim>& sd = run.stage_dims();
        const int pp = run.dims().index(DimRole::pp), n = run.stage_comm().size();
        for (int d = 0; d < run.dims().ndim(); ++d) {
            if (d == pp) continue;
            const int at = pp >= 0 && d > pp ? d - 1 : d;  // its position among the stage's dims
            std::vector<int>& first = out[d];
            for (int r = 0; r < n; ++r) {
                std::vector<int> c = DeviceMesh::coords_of(r, sd);
                c[at] = 0;
                first.push_back(DeviceMesh::rank_of(c, sd));
            }
        }
        return out;
    }

    ReplicaState replica_state(const Tensor& local, const Placements& pl, bool ignored) {
        const Agreement a = agreement(local, pl);
        ReplicaState state = a.replicas ? ReplicaState::equal : ReplicaState::sharded;
        if (ignored && data_.size() > 1) state = a.data ? ReplicaState::synced : ReplicaState::ignored;
        if (!a.model || (!a.data && !ignored)) state = ReplicaState::differ;
        return state;
    }

    // The output: each microbatch's gathered by its layout (every dp rank holds its part of each),
    // the microbatches concatenated in order, as the reference's rows are.
    void record_output(StepRecord& sr, const std::string& name, const std::vector<Placed>& outs,
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
                    queue_diff(Target::reference, name,
                               piece(host, *it->second, b, rule_for(opt_.tol, name)));
                if (auto it = golden_.find(name); it != golden_.end())
                    queue_diff(Target::golden, name, piece(host, *it->second, b, rule_for(opt_.tol, name)));
            }
            note_state(sr, name, state);
            return;
        }
        keep(sr, name, mine, whole, state, last_step);
    }

    // Returns the full tensor on the host (rank 0); rank-locally, nothing.
    Tensor record(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl,
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

    // Another stage's whole tensor for rank 0, sent by the stage's leader at the flush (its words:
    // the replica state, then the tensor's); rank 0's own stage's, kept at once.
    void send_whole(StepRecord& sr, const std::string& name, const Tensor& full, ReplicaState state) {
        if (rank0_) {
            keep(sr, name, Tensor(), full, state, false);
            return;
        }
        if (!leader_) return;
        std::vector<int64_t> words{static_cast<int64_t>(state)};
        const std::vector<int64_t> t = tensor_words(on_host(full));
        words.insert(words.end(), t.begin(), t.end());
        queue(Target::tensor, name, std::move(words));
    }

    Tensor keep(StepRecord& sr, const std::string& name, const Tensor& local, const Tensor& full,
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

    Run& run_;
    const RecordOptions& opt_;
    std::vector<std::pair<std::string, ParamPtr>> shadow_;
    std::unique_ptr<Optimizer> shadow_opt_;
    const bool rank0_;
    Communicator& data_;  // the batch's group: activations' rows, the loss
    // loss_normalization global_tokens: each rank's loss is its part of the step's sum / count
    bool summed_loss() const {
        return run_.plan().normalization(run_.model()) == LossNormalization::global_tokens;
    }
    std::vector<int> order_;
    std::unordered_map<std::string, const Tensor*> reference_, golden_;
    const bool local_;
    bool leader_ = false;
    std::map<int, std::vector<int>> group_first_;  // group_firsts()  // coordinate 0 on every dim but pp:
                                                   // speaks for its stage (rank 0 without pp)
    // A module event kept for comparison at the step's end (RecordOptions::follow): its key, this
    // rank's piece (rank-local: undefined on a rank that does not count it) or rank 0's gathered
    // tensor, with the layout and shape it had.
    struct Deferred {
        std::string key;
        Placed x;
        Shape shape;
        bool local;
    };
    std::vector<Deferred> deferred_;
    std::vector<KeyedEntry> queue_;                        // for rank 0, sent at the next flush
    std::unordered_map<std::string, size_t> event_index_;  // rank 0: the step's events by key
    const StepRecord* ref_events_of_ = nullptr;            // the reference step ref_events_ indexes
    std::unordered_map<std::string, const ModuleEvent*> ref_events_;
    RunRecord* init_ = nullptr;                           // construction's record (flush)
    std::unordered_map<std::string, size_t> init_index_;  // rank 0: init_state's index by name
    std::set<std::string> init_differ_;                   // rank 0: state whose replicas differ
};

}  // namespace

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
        StepOutput out = run.step(k, recorder.observer(sr));
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
