// Placement of a tensor along one mesh dim, as torch.distributed.tensor's: Replicate, Shard(d)
// (torch.chunk semantics for uneven sizes: chunks of ceil(n/p), the last ones shorter or empty),
// Partial (each rank holds a summand).
#pragma once

#include <string>

#include "core/tensor.h"

namespace ptool {

struct Placement {
    enum class Kind { replicate, shard, partial };
    Kind kind = Kind::replicate;
    int64_t dim = 0;  // Shard only; may be negative (from the end) until normalised against a shape

    static Placement replicate() { return {Kind::replicate, 0}; }
    static Placement shard(int64_t d) { return {Kind::shard, d}; }
    static Placement partial() { return {Kind::partial, 0}; }
    bool is_replicate() const { return kind == Kind::replicate; }
    bool is_shard() const { return kind == Kind::shard; }
    bool is_partial() const { return kind == Kind::partial; }
    Placement normalized(int64_t ndim) const;  // Shard(-1) -> Shard(ndim - 1)
    bool same_as(const Placement& o, int64_t ndim) const;
    std::string str() const;  // "Replicate()", "Shard(0)", "Partial(sum)"
};

// "replicate", "shard(0)", "shard(-1)", "partial"; false when the text is none of these.
bool parse_placement(const std::string& text, Placement* out);

// The local shape of a tensor of global shape `global` on coordinate `index` of `parts`.
Shape local_shape(const Shape& global, const Placement& p, int parts, int index);

}  // namespace ptool
