// Placement gathering for the Recorder (verify/recorder_state.h): where this rank's piece of a
// parameter, gradient or activation sits in the whole tensor, gathering it whole, and the boxes
// each rank compares in place.
#include <algorithm>

#include "core/tensor_ops.h"
#include "parallel/redistribute.h"
#include "verify/digest.h"
#include "verify/recorder_state.h"

namespace ptool::recording {

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

// A full tensor's digest, as the pieces of a sharded one add up to it (verify/digest.h).
uint64_t state_digest(const Tensor& full) {
    const Tensor h = on_host(full);
    return finish_element_hash(element_hash_sum(h, h.shape(), std::vector<int64_t>(h.shape().size(), 0)),
                               h.dtype(), h.shape());
}

// A parameter's full tensor from this rank's piece: the innermost cut first (fully_shard's
// rows of the tp piece, then the tp piece); a cut over dims joined, over their flattened group
// (fully_shard over dp_shard x cp: one uneven all_gather, as FSDP2's).
Tensor Recorder::gather(const Tensor& local, const Placements& pl) {
    Tensor t = local;
    const std::vector<Placements::Cut> cuts = pl.cuts();
    for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {
        Communicator& c = run_.comm(it->mesh_dims);
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
Tensor Recorder::gather(const Placed& x) {
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

// The whole tensor's shape from this rank's piece's (uncounted metadata on each cutting dim).
Shape Recorder::whole_shape(const Shape& local, const Placements& pl) const {
    Shape s = local;
    const std::vector<Placements::Cut> cuts = pl.cuts();
    for (auto it = cuts.rbegin(); it != cuts.rend(); ++it)
        s = global_shape(s, it->p, run_.comm(it->mesh_dims));
    return s;
}

// This rank's coordinate in a cut's group and the group's size (its dims flattened, the first major).
static std::pair<int, int> cut_rank(const Run& run, const Placements::Cut& cut) {
    int index = 0, parts = 1;
    for (int d : cut.mesh_dims) {
        const Communicator& c = run.comm(d);
        index = index * c.size() + c.rank(), parts *= c.size();
    }
    return {index, parts};
}

// Where this rank's piece of a tensor of `whole` shape placed as `pl` sits: each cut's chunk of
// what the cuts outside it left (the tp piece, then fully_shard's rows of it).
Box Recorder::box_of(const Shape& whole, const Placements& pl) const {
    Box b{std::vector<int64_t>(whole.size(), 0), whole, owns(pl), threads(pl)};
    for (const Placements::Cut& cut : pl.cuts()) {
        const auto [index, parts] = cut_rank(run_, cut);
        if (cut.p.is_owned() && index != cut.p.dim && !b.shape.empty()) b.shape[0] = 0;
        if (!cut.p.is_shard()) continue;
        const int64_t d = cut.p.normalized(static_cast<int64_t>(whole.size())).dim;
        const Chunk ch = chunk_of(b.shape[d], parts, index);
        b.offset[d] += ch.offset, b.shape[d] = ch.length;
    }
    return b;
}

// Whether this rank counts its piece: one rank of each group of replicas (coordinate 0 on the
// dims the tensor is not sharded over), in each pipeline stage.
bool Recorder::owns(const Placements& pl) const {
    for (int d : order_)  // every dim but pp: each stage owns its own tensors
        if (!pl.on(d).splits() && run_.comm(d).rank() != 0) return false;
    return true;
}

// box_of's box, compared by every replica that holds it bitwise (`state`, known on every rank
// after replica_state): each compares its chunk of the box's rows instead of one comparing it
// whole while the others wait. The copies are bitwise the same and the pieces' sums exact, so
// the numbers are those of comparing one copy whole; replicas that differ are not split (the
// coordinate-0 copy is compared whole, as box_of's). Replicas over the data dims differ by
// design under an ignored module; those over the others never.
Box Recorder::shared_box(const Shape& whole, const Placements& pl, ReplicaState state) const {
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
Tensor Recorder::piece_of(const Tensor& whole, const Placements& pl) const {
    Tensor piece = whole;
    for (const Placements::Cut& cut : pl.cuts()) {
        const auto [index, parts] = cut_rank(run_, cut);
        if (cut.p.is_owned() && index != cut.p.dim) piece = piece.narrow(0, 0, 0);
        if (!cut.p.is_shard()) continue;
        piece = chunk(piece, parts, index, cut.p.normalized(piece.dim()).dim);
    }
    return piece;
}

// The whole tensor's state digest from the pieces: each owner hashes its piece where it sits,
// rank 0 adds the sums at the flush (verify/digest.h). Replicas that agree (`state`) hash
// their chunks of the rows (shared_box). Words: the sum, the dtype, whether the replicas
// agree, the whole shape.
void Recorder::queue_digest(const std::string& name, const Tensor& local, const Placements& pl,
                            ReplicaState state, bool agree) {
    const Shape whole = whole_shape(local.shape(), pl);
    const Box b = shared_box(whole, pl, state);
    std::vector<int64_t> words{
        b.owner ? static_cast<int64_t>(element_hash_sum(b.part(on_host(local)), whole, b.part_offset())) : 0,
        static_cast<int64_t>(local.dtype()), agree ? 1 : 0};
    words.insert(words.end(), whole.begin(), whole.end());
    queue(Target::digest, name, std::move(words));
}

// An activation's placements: every data rank's rows (the data dims flattened), then each cp
// rank's positions (a whole tensor taken in cp order: in_cp_order), then its layout on the tp
// dim (x.global: this data and cp rank's).
Placements Recorder::activation_placements(const Placed& x) const {
    Placements pl;
    for (int d : run_.dims().data_dims()) pl.then(d, Placement::shard(0));
    if (context()) pl.then(run_.dims().index(DimRole::cp), Placement::shard(1));
    if (run_.dims().has(DimRole::tp)) pl.then(run_.dims().index(DimRole::tp), x.p);
    return pl;
}

const ContextShard* Recorder::context() const {
    const ContextShard* cp = run_.context();
    return cp && cp->parts > 1 ? cp : nullptr;
}

// A whole activation (the reference's, in position order) in cp order: each cp rank's
// positions are then its Shard(1) chunk (model/context_shard.h). Itself without load balancing.
Tensor Recorder::in_cp_order(const Tensor& whole) const {
    const ContextShard* cp = context();
    return cp && cp->load_balance && whole.dim() > 1 ? cp->cp_ordered(whole, 1) : whole;
}

// An activation's box: every data rank's rows, then its layout on the tp dim.
Box Recorder::activation_box(const Shape& whole, const Placed& x) const {
    if (whole.empty()) return Box{{}, whole, true};
    Box b = box_of(whole, activation_placements(x));
    b.threads = 1;
    return b;
}

// This rank's part of a comparison: its piece (its rows of it) against the box of the whole
// expected tensor (a piece of another shape than its box fails on every rank that holds one).
DiffPiece Recorder::piece(const Tensor& mine, const Tensor& expected, const Box& b, const Tolerance& tol) {
    if (mine.shape() != b.shape) return bad_shape();
    return b.owner ? compare_piece(b.part(mine), expected, b.part_offset(), tol, b.threads) : DiffPiece{};
}

DiffPiece Recorder::bad_shape() {
    DiffPiece bad;
    bad.counted = true, bad.d.shape_ok = bad.d.pass = false;
    return bad;
}

}  // namespace ptool::recording
