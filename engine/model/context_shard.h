// Context parallelism's view of the sequence from one rank (torch's context_parallel, torchtitan's
// cp): the batch's sequence dim (dim 1 of every activation) is split over the cp ranks for the
// whole model, and each rank holds some of the positions. Without load balancing rank r holds
// chunk r of cp equal chunks; with it (PyTorch's default for causal attention, as Transformer
// Engine and torchtitan do) the sequence is cut into 2 x cp chunks and rank r holds chunks r and
// 2cp-1-r, so every rank has as much of the causal triangle's work as any other.
//
// Modules that depend on where a token sits ask here: rope rotates by the global position,
// position_embedding adds its row, dropout draws the element's global mask, and attention gathers
// keys and values over `comm` and masks by position (model/modules/attention.cpp). A full-sequence
// tensor in "cp order" is the ranks' pieces concatenated (what an all_gather along dim 1 gives);
// natural() and cp_ordered() convert between that and position order.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "core/tensor_ops.h"

namespace ptool {

class Communicator;

// allgather: each attention gathers every rank's keys and values (the Llama 3 paper's choice,
// torch's set_rotate_method("allgather")); alltoall: keys and values travel around a ring, one
// block per step (torch's "alltoall", ring attention).
enum class RotateMethod { allgather, alltoall };

// The ring's point-to-point tags (model/modules/attention_ring.cpp): a block's keys and values,
// the gradients that travel with them, and the last hop that returns the gradients to the rank
// that holds those keys (verify/faults.cpp's cp_kv_grads_local drops it).
enum RingTag : int {
    ring_keys = 0,
    ring_values,
    ring_key_grads,
    ring_value_grads,
    ring_return_keys,
    ring_return_values
};

struct ContextShard {
    int64_t seq = 0;  // the whole sequence
    int parts = 1, rank = 0;
    bool load_balance = false;
    RotateMethod rotate = RotateMethod::allgather;
    Communicator* comm = nullptr;    // the cp group
    std::vector<Chunk> chunks;       // this rank's ranges of positions, in local order
    std::vector<int64_t> positions;  // the global position of each local token
    // Every cp rank's positions (rank_positions[rank] == positions): where the keys of a block that
    // came round the ring from rank r sit, which its causal mask reads.
    std::vector<std::vector<int64_t>> rank_positions;

    // InputError-free: the caller has checked that seq divides into parts (2 x parts balanced).
    static ContextShard make(int64_t seq, int parts, int rank, bool load_balance, RotateMethod rotate,
                             Communicator* comm);
    // Rank r's ranges of positions.
    static std::vector<Chunk> chunks_of(int64_t seq, int parts, int rank, bool load_balance);
    // How many chunks the sequence is cut into (parts, or 2 x parts balanced): it must divide the sequence.
    static int64_t pieces(int parts, bool load_balance) { return load_balance ? 2 * parts : parts; }

    int64_t local() const { return static_cast<int64_t>(positions.size()); }
    bool ring() const { return parts > 1 && rotate == RotateMethod::alltoall; }
    int next() const { return (rank + 1) % parts; }          // where the ring sends
    int prev() const { return (rank + parts - 1) % parts; }  // where it receives from
    // This rank's tokens of a whole-sequence tensor (position order along dim), contiguous.
    Tensor take(const Tensor& whole, int64_t dim) const;
    // A whole-sequence tensor from cp order to position order, and back (identity unbalanced).
    Tensor natural(const Tensor& cp_ordered, int64_t dim) const;
    Tensor cp_ordered(const Tensor& natural, int64_t dim) const;
};

}  // namespace ptool
