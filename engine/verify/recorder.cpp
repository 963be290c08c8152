#include "verify/recorder.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "core/tensor_ops.h"
#include "model/batch.h"
#include "model/optimizer.h"
#include "parallel/redistribute.h"
#include "verify/digest.h"

namespace ptool {
namespace {

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

// The full size of dim `p.dim` from every rank's local size (uncounted metadata).
Shape global_shape(const Shape& local, const Placement& p, Communicator& comm) {
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
    return finish_element_hash(element_hash_sum(h, h.shape(), std::vector<int64_t>(h.shape().size(), 0)), h.dtype(), h.shape());
}

// Where this rank's piece of a tensor sits in the whole one: the box at `offset` of `shape`, and
// whether this rank counts it (one rank of each group of replicas does, or each its rows of it).
struct Box {
    std::vector<int64_t> offset;
    Shape shape;
    bool owner = true;
    int threads = 1;           // compare_piece's: more where one rank compares a replicated tensor alone
    Chunk rows{0, -1};         // the rows (dim 0) of the piece this rank compares; length -1: all
    // The part of this rank's piece it compares (its rows, or all of it) and where it starts in the whole
    Tensor part(const Tensor& piece) const { return rows.length < 0 ? piece : piece.narrow(0, rows.offset, rows.length); }
    std::vector<int64_t> part_offset() const {
        std::vector<int64_t> at = offset;
        if (rows.length >= 0) at[0] += rows.offset;
        return at;
    }
};

class Recorder {
public:
    Recorder(Run& run, const RecordOptions& opt)
        : run_(run), opt_(opt), rank0_(run.world().rank() == 0), data_(run.data_comm()),
          local_(opt.rank_local && opt.compare_with) {  // a parallel run against a reference (which records whole)
        if (opt.golden)
            for (const auto& [name, t] : opt.golden->tensors) golden_[name] = &t;
        // the dims in the order a replica's chunk is numbered (shared_box): those that cut
        // parameters (tp, then the data dims), then any other
        order_ = run.dims().param_nesting();
        for (int d = 0; d < run.dims().ndim(); ++d)
            if (std::find(order_.begin(), order_.end(), d) == order_.end()) order_.push_back(d);
    }

    // The shadow optimizer (rank 0, compared runs, AdamW): the model's optimizer stepping full-size
    // copies of the parameters with the gradients this run recorded, so each step's parameters can
    // be checked against what the optimizer makes of the run's own gradients (verify/report.cpp).
    void start_shadow() {  // collective: every rank gathers, rank 0 keeps
        // AdamW amplifies rounding-sized gradient differences; under mixed precision every update
        // carries the compute dtype's into the full-precision masters
        if (!opt_.shadow_optimizer || (run_.model().optimizer.type != OptimizerType::adamw && !opt_.tol.masters)) return;
        Unaccounted pause(&run_.counter());
        if (local_) {  // each rank steps its own pieces: the optimizer is elementwise
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
        if (rank0_) shadow_opt_ = std::make_unique<Optimizer>(run_.model().optimizer, backend_for(Device::cpu));
    }

    // A parameter's full tensor from this rank's piece: the innermost cut first (fully_shard's
    // rows of the tp piece, then the tp piece).
    Tensor gather(const Tensor& local, const Placements& pl) {
        Tensor t = local;
        for (auto it = pl.nested.rbegin(); it != pl.nested.rend(); ++it) {
            Communicator& c = run_.comm(it->mesh_dim);
            t = full_tensor(t, it->p, global_shape(t.shape(), it->p, c), c);
        }
        return t;
    }

    // An activation's: whole on the tp dim by its layout, then every data rank's rows.
    Tensor gather(const Placed& x) {
        const Tensor t = full_tensor(x.t, x.p, x.global, tp());
        return data_.size() > 1 ? full_tensor(t, Placement::shard(0), global_shape(t.shape(), Placement::shard(0), data_), data_) : t;
    }

    void construction(RunRecord& rec) {
        Unaccounted pause(&run_.counter());
        for (const auto& [name, p] : run_.model().state_dict()) {
            const bool buffer = p->grad.numel() == 0 && p->value.numel() != 0;
            const Placements pl = buffer ? Placements{} : run_.placements(p.get());
            const bool ignored = run_.ignored(name);
            const Agreement a = agreement(p->value, pl);
            const bool agree = a.model && (ignored || a.data);
            uint64_t digest = 0;  // collective either way; rank 0 keeps it
            const ReplicaState state = !agree ? ReplicaState::differ : ignored ? ReplicaState::ignored : ReplicaState::equal;
            if (local_ && !pl.any_partial()) digest = piece_digest(p->value, pl, state);
            else if (const Tensor full = gather(p->value, pl); rank0_) digest = state_digest(full);
            if (!rank0_) continue;
            if (!agree) rec.init_replicas_differ.push_back(name);
            rec.init_state.emplace_back(name, digest);
        }
        if (opt_.init_tensors) {  // golden files: init.param.* then init.buffer.*, each tensor once
            for (const auto& [name, p] : run_.model().named_parameters()) {
                const Tensor full = gather(p->value, run_.placements(p.get()));
                if (rank0_) rec.init_tensors.emplace_back("init.param." + name, on_host(full).clone());
            }
            for (const auto& [name, b] : run_.model().named_buffers())
                if (rank0_) rec.init_tensors.emplace_back("init.buffer." + name, on_host(b->value).clone());
        }
        rec.unique_params = static_cast<int64_t>(run_.model().named_parameters().size());
        for (const auto& r : run_.resolution().dp.replicas) {
            rec.dp_buckets += static_cast<int64_t>(r.buckets.size());
            for (const auto& b : r.buckets) rec.grad_bytes += b.bytes;
        }
    }

    StepObserver observer(StepRecord& sr) {
        if (!opt_.events) return nullptr;
        // under data parallel a mean loss over each rank's rows makes activation gradients dp times
        // the reference's (DDP's average puts the parameter gradients right): scaled for comparison
        const double scale = data_.size() > 1 && run_.model().loss != LossKind::sum ? 1.0 / data_.size() : 1.0;
        auto index = std::make_shared<size_t>(0);  // this step's events so far, on every rank
        return [this, &sr, scale, index](const Module& m, Phase phase, const Placed& x) {
            Unaccounted pause(&run_.counter());
            auto as_reference = [&](const Tensor& t) {  // a backward event at the reference's scale
                if (phase != Phase::backward || scale == 1.0) return t;
                Tensor scaled = empty_like(t);
                backend_for(t.device()).scale(t, scale, scaled);
                return scaled;
            };
            if (local_ && !x.p.is_partial()) {
                const size_t at = (*index)++;
                if (opt_.follow) {  // compared at the step's end, once the reference published it
                    Tensor mine;
                    if (activation_box(x.global, x).owner) {
                        mine = as_reference(on_host(x.t));
                        if (mine.shares_storage(x.t)) mine = mine.clone();
                    }
                    deferred_.push_back({at, m.fqn(), phase, Placed{mine, x.p, x.global}, x.t.shape(), true});
                    if (rank0_) sr.events.push_back({m.fqn(), phase, Tensor(), {}});
                    return;
                }
                const ModuleEvent* ref = reference_event(sr.step, at);
                if (ref && ref->fqn == m.fqn() && ref->phase == phase && ref->full.defined()) {
                    const Tensor mine = as_reference(on_host(x.t));
                    reduce_later(piece(mine, ref->full, activation_box(ref->full.shape(), x), opt_.tol), opt_.tol,
                                 [&sr, i = sr.events.size()](const TensorDiff& d) { sr.events[i].diff = d; });
                }
                if (rank0_) sr.events.push_back({m.fqn(), phase, Tensor(), {}});
                return;
            }
            if (local_) ++*index;
            const Tensor full = as_reference(gather(x));
            if (!rank0_) return;
            ModuleEvent e{m.fqn(), phase, Tensor(), {}};
            if (!opt_.compare_with) {
                e.full = full.shares_storage(x.t) ? on_host(full).clone() : on_host(full);
            } else if (opt_.follow) {
                const Tensor kept = full.shares_storage(x.t) ? on_host(full).clone() : on_host(full);
                deferred_.push_back({sr.events.size(), e.fqn, phase, Placed{kept, x.p, x.global}, kept.shape(), false});
            } else if (const ModuleEvent* ref = reference_event(sr.step, sr.events.size()); ref && ref->fqn == e.fqn && ref->phase == phase) {
                e.diff = compare_tensors(on_host(full), ref->full, opt_.tol);
            }
            sr.events.push_back(std::move(e));
        };
    }

    void step(StepRecord& sr, const StepOutput& out, bool last_step) {
        Unaccounted pause(&run_.counter());
        reference_.clear();
        const StepRecord* ref_step = (rank0_ || local_) ? reference_step(sr.step) : nullptr;  // waits when following
        if (ref_step)
            for (const auto& [name, t] : ref_step->tensors) reference_[name] = &t;
        compare_deferred(sr, ref_step);
        const std::string s = fmt::format("step{}.", sr.step);
        // each rank's output rows and loss are its own: gathered and combined as the global batch's
        record_output(sr, s + "output", out.outputs, last_step);
        Tensor loss = Tensor::scalar(out.loss, DType::float64).reshape({1});
        if (data_.size() > 1) data_.all_reduce(loss, run_.model().loss == LossKind::sum ? ReduceOp::sum : ReduceOp::avg);
        record(sr, s + "loss", Tensor::scalar(loss.item(0), run_.model().dtype), {}, false, last_step);
        if (data_.size() > 1 && rank0_) sr.replicas[s + "loss"] = ReplicaState::sharded;  // combined from each rank's own
        if (run_.model().clip_grad_norm > 0)  // what clip_grad_norm_ returns: a scale of every gradient shows here
            record(sr, s + "grad_norm", Tensor::scalar(out.grad_norm, DType::float64), {}, false, last_step);
        const auto params = run_.model().named_parameters();
        for (size_t i = 0; i < params.size(); ++i) {
            const auto& [name, p] = params[i];
            const Tensor g = record(sr, s + "grad." + name, p->grad, run_.placements(p.get()), run_.ignored(name), last_step);
            if (!shadow_.empty()) shadow_[i].second->grad = local_ ? on_host(p->grad).clone() : g.clone();
        }
        if (!shadow_.empty()) shadow_opt_->step(shadow_);  // what the optimizer makes of these gradients
        for (size_t i = 0; i < params.size(); ++i) {
            const auto& [name, p] = params[i];
            const Tensor v = record(sr, s + "param." + name, p->value, run_.placements(p.get()), run_.ignored(name), last_step);
            if (shadow_.empty()) continue;
            if (local_) {  // this rank's piece against its shadow piece, counted once per group of replicas
                const Placements pl = run_.placements(p.get());
                const Box b{std::vector<int64_t>(p->value.dim(), 0), p->value.shape(), owns(pl), threads(pl)};
                const Tolerance rule = opt_.tol.for_masters();
                reduce_later(piece(on_host(p->value), shadow_[i].second->value, b, rule), rule,
                             [&sr, key = s + "param." + name](const TensorDiff& d) { sr.vs_shadow[key] = d; });
            } else if (rank0_) {
                sr.vs_shadow[s + "param." + name] = compare_tensors(v, shadow_[i].second->value, opt_.tol.for_masters());
            }
        }
        for (const auto& [name, b] : run_.model().named_buffers()) record(sr, s + "buffer." + name, b->value, {}, false, last_step);
        flush_reduces();  // the step's comparisons, the module events' included
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
        if (rank0_)
            for (const auto& [name, p] : params) {
                auto it = diffs.find(s + name);
                if (!run_.ignored(name) && it != diffs.end() && it->second.max_abs != 0 && truth.count(s + name)) flag.set(0, 1);
            }
        Communicator& world = run_.world();
        Unaccounted pause(&run_.counter());
        world.broadcast(flag, 0);
        if (flag.item(0) == 0) return;
        for (size_t i = 0; i < params.size(); ++i) {
            const auto& [name, p] = params[i];
            if (run_.ignored(name)) continue;
            const Placements pl = run_.placements(p.get());
            Tensor piece;
            if (local_ && truth.count(s + name)) {  // each rank cuts its piece of the truth: no broadcast
                piece = piece_of(*truth.at(s + name), pl).to(p->value.dtype());
                PTOOL_REQUIRE(piece.shape() == p->value.shape(), "resync of '{}': {} for {}", name, shape_str(piece.shape()),
                              shape_str(p->value.shape()));
                if (!shadow_.empty()) shadow_[i].second->value = piece.clone();
            } else {  // rank 0 broadcasts the whole truth; every rank cuts its piece
                Tensor full(whole_shape(p->value.shape(), pl), p->value.dtype());
                if (rank0_) {
                    const Tensor& t = *truth.at(s + name);
                    PTOOL_REQUIRE(t.shape() == full.shape(), "resync of '{}': {} for {}", name, shape_str(t.shape()), shape_str(full.shape()));
                    full = t.to(full.dtype()).clone();
                    if (!shadow_.empty()) shadow_[i].second->value = full.clone();
                }
                world.broadcast(full, 0);
                piece = piece_of(full, pl);
            }
            run_.backend().copy(p->value.device() == Device::cpu ? piece : piece.to_device(p->value.device()), p->value);
        }
    }

private:
    Communicator& tp() const { return run_.comm(DimRole::tp); }

    // The whole tensor's shape from this rank's piece's (uncounted metadata on each cutting dim).
    Shape whole_shape(const Shape& local, const Placements& pl) const {
        Shape s = local;
        for (auto it = pl.nested.rbegin(); it != pl.nested.rend(); ++it) s = global_shape(s, it->p, run_.comm(it->mesh_dim));
        return s;
    }

    // Where this rank's piece of a tensor of `whole` shape placed as `pl` sits: each cutting dim's
    // chunk of what the dims outside it left (the tp piece, then fully_shard's rows of it).
    Box box_of(const Shape& whole, const Placements& pl) const {
        Box b{std::vector<int64_t>(whole.size(), 0), whole, owns(pl), threads(pl)};
        for (const Placements::On& o : pl.nested) {
            if (!o.p.is_shard()) continue;
            const Communicator& c = run_.comm(o.mesh_dim);
            const int64_t d = o.p.normalized(static_cast<int64_t>(whole.size())).dim;
            const Chunk ch = chunk_of(b.shape[d], c.size(), c.rank());
            b.offset[d] += ch.offset, b.shape[d] = ch.length;
        }
        return b;
    }

    // Whether this rank counts its piece: one rank of each group of replicas (coordinate 0 on the
    // dims the tensor is not sharded over).
    bool owns(const Placements& pl) const {
        for (int d = 0; d < run_.dims().ndim(); ++d)
            if (!pl.on(d).is_shard() && run_.comm(d).rank() != 0) return false;
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
        const bool model_agree = state == ReplicaState::equal || state == ReplicaState::synced || state == ReplicaState::ignored;
        const bool data_agree = state == ReplicaState::equal || state == ReplicaState::synced;
        int parts = 1, index = 0;
        bool owner = true;
        for (int d : order_) {
            const Communicator& c = run_.comm(d);
            if (!pl.on(d).is_replicate() || c.size() == 1) continue;
            if (run_.dims().is_data_dim(d) ? data_agree : model_agree) index = index * c.size() + c.rank(), parts *= c.size();
            else owner = owner && c.rank() == 0;
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
            if (!o.p.is_shard()) continue;
            const Communicator& c = run_.comm(o.mesh_dim);
            piece = chunk(piece, c.size(), c.rank(), o.p.normalized(piece.dim()).dim);
        }
        return piece;
    }

    // The whole tensor's state digest from the pieces (collective; meaningful on rank 0): each
    // owner hashes its piece where it sits, rank 0 adds the sums (verify/digest.h).
    // Replicas that agree (`state`) hash their chunks of the rows (shared_box).
    uint64_t piece_digest(const Tensor& local, const Placements& pl, ReplicaState state) {
        const Shape whole = whole_shape(local.shape(), pl);
        const Box b = shared_box(whole, pl, state);
        Tensor mine({1}, DType::int64), all({run_.world().size()}, DType::int64);
        mine.data<int64_t>()[0] = b.owner ? static_cast<int64_t>(element_hash_sum(b.part(on_host(local)), whole, b.part_offset())) : 0;
        run_.world().all_gather(mine, all);
        uint64_t sum = 0;
        for (int r = 0; r < run_.world().size(); ++r) sum += static_cast<uint64_t>(all.data<int64_t>()[r]);
        return finish_element_hash(sum, local.dtype(), whole);
    }

    // An activation's placements: every data rank's rows (the data dims flattened), then its layout
    // on the tp dim (x.global: this data rank's rows).
    Placements activation_placements(const Placed& x) const {
        Placements pl;
        for (int d : run_.dims().data_dims()) pl.then(d, Placement::shard(0));
        if (run_.dims().has(DimRole::tp)) pl.then(run_.dims().index(DimRole::tp), x.p);
        return pl;
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

    // Every rank's piece of a comparison, merged in rank order on rank 0, where `set` receives the
    // diff. Queued: the step's comparisons travel in one all_gather at its end (flush_reduces), not
    // one each (eight rank threads taking turns on two cores spent a third of a verify's comparison
    // phase handing the cores round for them). Every rank queues the same list in the same order.
    void reduce_later(const DiffPiece& mine, const Tolerance& tol, std::function<void(const TensorDiff&)> set) {
        pending_.push_back({mine, tol, std::move(set)});
    }

    void flush_reduces() {  // collective
        if (pending_.empty()) return;
        Communicator& world = run_.world();
        const int64_t n = static_cast<int64_t>(pending_.size());
        Tensor packed({n * kPieceWords}, DType::int64), all({world.size() * n * kPieceWords}, DType::int64);
        for (int64_t i = 0; i < n; ++i) pack_piece(pending_[i].piece, packed.data<int64_t>() + i * kPieceWords);
        world.all_gather(packed, all);
        if (rank0_)
            for (int64_t i = 0; i < n; ++i) {
                DiffPiece merged;
                for (int r = 0; r < world.size(); ++r)
                    merge_piece(merged, unpack_piece(all.data<int64_t>() + (r * n + i) * kPieceWords));
                pending_[i].set(finish_diff(merged, pending_[i].tol));
            }
        pending_.clear();
    }

    // A parameter's or gradient's piece compared where it lies (rank-local).
    void keep_local(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl, ReplicaState state) {
        const Tensor mine = on_host(local);
        const Tolerance tol = rule_for(opt_.tol, name);
        if (auto it = reference_.find(name); it != reference_.end())
            reduce_later(piece(mine, *it->second, shared_box(it->second->shape(), pl, state), tol), tol,
                         [&sr, name](const TensorDiff& d) { sr.vs_reference[name] = d; });
        if (auto it = golden_.find(name); it != golden_.end())
            reduce_later(piece(mine, *it->second, shared_box(it->second->shape(), pl, state), tol), tol,
                         [&sr, name](const TensorDiff& d) { sr.vs_golden[name] = d; });
        if (rank0_) sr.replicas[name] = state;
    }

    // The reference's step (null: none, or no reference); following one recorded beside this
    // run, it waits until that step is published.
    const StepRecord* reference_step(int64_t step) const {
        if (!opt_.compare_with) return nullptr;
        if (opt_.follow) return opt_.follow->step(step);
        const RunRecord& ref = *opt_.compare_with;
        return step < static_cast<int64_t>(ref.steps.size()) ? &ref.steps[step] : nullptr;
    }

    const ModuleEvent* reference_event(int64_t step, size_t index) const {
        const StepRecord* ref = reference_step(step);
        return ref && index < ref->events.size() ? &ref->events[index] : nullptr;
    }

    // The step's module events kept while following the reference, compared now in the order they
    // were recorded: rank-local ones collectively (every rank kept the same list), gathered ones
    // on rank 0; the numbers are what comparing them inside the step gives.
    void compare_deferred(StepRecord& sr, const StepRecord* ref_step) {
        for (const Deferred& d : deferred_) {
            const ModuleEvent* ref = ref_step && d.index < ref_step->events.size() ? &ref_step->events[d.index] : nullptr;
            const bool same = ref && ref->fqn == d.fqn && ref->phase == d.phase;
            if (!d.local) {
                if (same) sr.events[d.index].diff = compare_tensors(d.x.t, ref->full, opt_.tol);
                continue;
            }
            if (!same || !ref->full.defined()) continue;
            const Box b = activation_box(ref->full.shape(), d.x);
            const DiffPiece mine = d.shape != b.shape ? bad_shape() : b.owner ? piece(d.x.t, ref->full, b, opt_.tol) : DiffPiece{};
            reduce_later(mine, opt_.tol, [&sr, i = d.index](const TensorDiff& diff) { sr.events[i].diff = diff; });
        }
        deferred_.clear();
    }

    // Whether a tensor's replicas agree bitwise, over the data dims and over the others (each dim
    // it is replicated on is checked: collective on every rank, whatever the others' result).
    struct Agreement {
        bool model = true, data = true;
        bool replicas = false;  // replicated over some dim of more than one rank
    };
    Agreement agreement(const Tensor& local, const Placements& pl) {
        Agreement a;
        for (int d : order_) {
            if (!pl.on(d).is_replicate()) continue;
            Communicator& c = run_.comm(d);
            const bool ok = replicas_agree(local, c);
            (run_.dims().is_data_dim(d) ? a.data : a.model) &= ok;
            a.replicas = a.replicas || c.size() > 1;
        }
        return a;
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
    void record_output(StepRecord& sr, const std::string& name, const std::vector<Placed>& outs, bool last_step) {
        std::vector<Tensor> full, local;
        for (const Placed& o : outs) full.push_back(gather(o)), local.push_back(o.t);
        const Tensor whole = full.size() == 1 ? full[0] : cat(full, 0), mine = local.size() == 1 ? local[0] : cat(local, 0);
        keep(sr, name, mine, whole, replica_state(mine, activation_placements(outs[0]), false), last_step);
    }

    // Returns the full tensor on the host (rank 0); rank-locally, nothing.
    Tensor record(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl, bool ignored,
                  bool last_step) {
        if (local_ && !pl.any_partial()) {
            keep_local(sr, name, local, pl, replica_state(local, pl, ignored));
            return {};
        }
        const Tensor full = gather(local, pl);
        return keep(sr, name, local, full, replica_state(local, pl, ignored), last_step);
    }

    Tensor keep(StepRecord& sr, const std::string& name, const Tensor& local, const Tensor& full, ReplicaState state, bool last_step) {
        if (!rank0_) return {};
        sr.replicas[name] = state;
        if (opt_.compare_with || opt_.golden) {  // compared now; a parallel run keeps the diffs only
            const Tensor host = on_host(full);
            const Tolerance tol = rule_for(opt_.tol, name);
            if (auto it = reference_.find(name); it != reference_.end()) sr.vs_reference[name] = compare_tensors(host, *it->second, tol);
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
    std::vector<int> order_;
    std::unordered_map<std::string, const Tensor*> reference_, golden_;
    const bool local_;
    // A module event kept for comparison at the step's end (RecordOptions::follow): its index in
    // the step's events, this rank's piece (rank-local: undefined on a rank that does not count
    // it) or rank 0's gathered tensor, with the layout and shape it had.
    struct Deferred {
        size_t index;
        std::string fqn;
        Phase phase;
        Placed x;
        Shape shape;
        bool local;
    };
    std::vector<Deferred> deferred_;
    struct PendingReduce {
        DiffPiece piece;
        Tolerance tol;
        std::function<void(const TensorDiff&)> set;  // on rank 0
    };
    std::vector<PendingReduce> pending_;
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
        if (opt.publish) opt.publish->wait_for_room(k);  // at most two steps ahead of the ranks; throws once cancelled
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
            rec.bucket_copy_bytes = dp->bucket_copy_bytes(), rec.bucket_allreduce_bytes = dp->bucket_allreduce_bytes();
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
        first = std::min(first, all.data<double>()[2 * r]), last = std::max(last, all.data<double>()[2 * r + 1]);
    return last - first;
}

}  // namespace ptool
