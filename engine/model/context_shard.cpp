#include "model/context_shard.h"

#include "core/check.h"

namespace ptool {

std::vector<Chunk> ContextShard::chunks_of(int64_t seq, int parts, int rank, bool load_balance) {
    const int64_t n = pieces(parts, load_balance), len = seq / n;
    if (!load_balance) return {{rank * len, len}};
    return {{rank * len, len}, {(n - 1 - rank) * len, len}};
}

ContextShard ContextShard::make(int64_t seq, int parts, int rank, bool load_balance, RotateMethod rotate,
                                Communicator* comm) {
    PTOOL_REQUIRE(parts >= 1 && seq % pieces(parts, load_balance) == 0, "a sequence of {} in {} pieces", seq,
                  pieces(parts, load_balance));
    ContextShard s;
    s.seq = seq, s.parts = parts, s.rank = rank, s.load_balance = load_balance && parts > 1;
    s.rotate = rotate, s.comm = comm;
    s.chunks = chunks_of(seq, parts, rank, s.load_balance);
    for (int r = 0; r < parts; ++r) {
        std::vector<int64_t>& at = s.rank_positions.emplace_back();
        for (const Chunk& c : chunks_of(seq, parts, r, s.load_balance))
            for (int64_t p = c.offset; p < c.offset + c.length; ++p) at.push_back(p);
    }
    s.positions = s.rank_positions[static_cast<size_t>(rank)];
    return s;
}

Tensor ContextShard::take(const Tensor& whole, int64_t dim) const {
    if (parts == 1) return whole;
    std::vector<Tensor> pieces;
    for (const Chunk& c : chunks) pieces.push_back(whole.narrow(dim, c.offset, c.length));
    return cat(pieces, dim);
}

Tensor ContextShard::natural(const Tensor& cp_ordered, int64_t dim) const {
    if (!load_balance) return cp_ordered;
    // cp order holds rank r's chunks (r, 2cp-1-r) at [2r, 2r+1] x len; position order is chunk 0..2cp-1
    const int64_t n = pieces(parts, true), len = seq / n;
    std::vector<Tensor> by_position(static_cast<size_t>(n));
    for (int r = 0; r < parts; ++r) {
        const std::vector<Chunk> cs = chunks_of(seq, parts, r, true);
        for (size_t i = 0; i < cs.size(); ++i)
            by_position[static_cast<size_t>(cs[i].offset / len)] =
                cp_ordered.narrow(dim, (2 * r + static_cast<int64_t>(i)) * len, len);
    }
    return cat(by_position, dim);
}

Tensor ContextShard::cp_ordered(const Tensor& natural, int64_t dim) const {
    if (!load_balance) return natural;
    std::vector<Tensor> pieces;
    for (int r = 0; r < parts; ++r)
        for (const Chunk& c : chunks_of(seq, parts, r, true))
            pieces.push_back(natural.narrow(dim, c.offset, c.length));
    return cat(pieces, dim);
}

}  // namespace ptool
