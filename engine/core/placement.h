// Placement of a tensor along one mesh dim, as torch.distributed.tensor's: Replicate, Shard(d)
// (torch.chunk semantics for uneven sizes: chunks of ceil(n/p), the last ones shorter or empty),
// Partial (each rank holds a summand), and ptool's Owned(r) (the tensor whole on coordinate r of the
// dim and absent, zero-sized, elsewhere: an expert's weights under expert parallelism, which are
// torch's Shard(0) of the experts' stacked weights). A Layout is the static description of an activation on
// the tensor-parallel dim: its full shape and its placement, no data (explain and the lint work
// on layouts; the runtime's Placed, model/placed.h, is a local tensor with its layout).
#pragma once

#include <string>

#include "core/tensor.h"

namespace ptool {

struct Placement {
    enum class Kind { replicate, shard, partial, owned };
    Kind kind = Kind::replicate;
    int64_t dim = 0;  // Shard: may be negative (from the end) until normalised; Owned: the owner's coordinate

    static Placement replicate() { return {Kind::replicate, 0}; }
    static Placement shard(int64_t d) { return {Kind::shard, d}; }
    static Placement partial() { return {Kind::partial, 0}; }
    static Placement owned(int64_t owner) { return {Kind::owned, owner}; }
    bool is_replicate() const { return kind == Kind::replicate; }
    bool is_shard() const { return kind == Kind::shard; }
    bool is_partial() const { return kind == Kind::partial; }
    bool is_owned() const { return kind == Kind::owned; }
    // Each rank of the dim holds its own part (Shard or Owned): a sum over the tensor adds the dim's.
    bool splits() const { return is_shard() || is_owned(); }
    Placement normalized(int64_t ndim) const;  // Shard(-1) -> Shard(ndim - 1)
    bool same_as(const Placement& o, int64_t ndim) const;
    std::string str() const;  // "Replicate()", "Shard(0)", "Partial(sum)", "Owned(1)"
};

// The placement of a tensor's gradient: the tensor's own, except that every summand of a Partial
// tensor receives the whole gradient (Partial -> Replicate).
Placement grad_placement(const Placement& p);

// "replicate", "shard(0)", "shard(-1)", "partial"; false when the text is none of these.
bool parse_placement(const std::string& text, Placement* out);

// What a rank that does not own an Owned tensor holds: its shape with no rows ([0] for a scalar).
Shape absent_shape(Shape global);
// The local shape of a tensor of global shape `global` on coordinate `index` of `parts`.
Shape local_shape(const Shape& global, const Placement& p, int parts, int index);

// A tensor's placement on every dim of a device mesh, as a DTensor's `placements`, together with
// the order its shards nest in: `nested` lists the dims that cut (or hold partial sums of) the
// tensor, outermost first; a dim it does not list holds it whole (Replicate). A colwise weight
// under fully_shard x tensor parallel is {tp: Shard(0), dp: Shard(0)}: the tp rank's rows, then
// the dp rank's rows of those (DTensor's _StridedShard); an activation under dp x tp is {dp:
// Shard(0), tp: its layout}: the dp rank's batch rows, then the tp piece of those. Cutting walks
// `nested` front to back, gathering back to front. A dim `joined` to the one before it cuts with it
// as one: a Shard over their group flattened (`cuts`).
struct Placements {
    struct On {
        int mesh_dim = 0;
        Placement p;
        // Cuts together with the dim before it: one Shard (torch.chunk) over the two dims' ranks
        // flattened, the earlier dim's coordinate major (DeviceMesh._flatten), not each dim a chunk
        // of the other's. FSDP2's fully_shard over torchtitan's dp_shard_cp: 97 rows over dp_shard 2
        // x cp 2 are 25, 25, 25, 22 (nested chunks would be 25, 24, 24, 24; the same where even).
        bool joined = false;
    };
    std::vector<On> nested;

    // Adds mesh dim `d` inside the dims already listed (nothing when p is Replicate).
    Placements& then(int d, const Placement& p) {
        if (!p.is_replicate()) nested.push_back({d, p});
        return *this;
    }
    // Adds mesh dim `d` to the cut of the dim listed last, with its placement (nothing when none is).
    Placements& join(int d) {
        if (!nested.empty()) nested.push_back({d, nested.back().p, true});
        return *this;
    }
    // One cut: the mesh dims that make it (one, or several flattened in this order) and its placement.
    struct Cut {
        std::vector<int> mesh_dims;
        Placement p;
    };
    // `nested` with joined dims merged, outermost first.
    std::vector<Cut> cuts() const {
        std::vector<Cut> out;
        for (const On& o : nested)
            if (o.joined && !out.empty())
                out.back().mesh_dims.push_back(o.mesh_dim);
            else
                out.push_back({{o.mesh_dim}, o.p});
        return out;
    }
    Placement on(int mesh_dim) const {
        for (const On& o : nested)
            if (o.mesh_dim == mesh_dim) return o.p;
        return Placement::replicate();
    }
    bool any_shard() const {
        for (const On& o : nested)
            if (o.p.splits()) return true;
        return false;
    }
    bool any_partial() const {
        for (const On& o : nested)
            if (o.p.is_partial()) return true;
        return false;
    }
};

struct Layout {
    Shape global;  // the full tensor's shape on the tensor-parallel dim
    Placement p;
    bool same_as(const Layout& o) const {
        return global == o.global && p.same_as(o.p, static_cast<int64_t>(global.size()));
    }
    std::string str() const;  // "[4, 16, 32] Shard(1)"
};

}  // namespace ptool
