// Communicator: the collectives ranks use, as small as NCCL's API.
//
// - all_reduce(t, op): t the same shape on every rank, reduced in place (sum | avg | max).
// - all_gather(in, out): out = every rank's in concatenated along dim 0 (dim-0 sizes may differ).
// - reduce_scatter(in, out, op): in the full tensor; out this rank's torch.chunk of the reduction
//   along dim 0.
// - broadcast(t, root): t := root's t.
// - all_to_all(in, out): in and out in `size` equal dim-0 chunks; chunk j of in goes to rank j.
// - all_to_all_v(in, send_rows, out, recv_rows): the same with uneven dim-0 splits (below).
// - barrier(); split(color, key): the sub-communicator of the ranks with the same color, by key.
// - send(t, peer, tag), recv(t, peer, tag), batch_isend_irecv(ops): point-to-point, as
//   torch.distributed.send / recv / batch_isend_irecv: two ranks of this communicator, the others
//   take no part.
//
// Every implementation reduces in rank order (sum over ranks 0..n-1 in acc_t, one rounding), so
// results are bitwise the same on every rank, every run, and across the threads and mpi backends.
// Every collective is checked for consistency across ranks (op, dtype, shape, sequence number)
// unless disabled, has a timeout, and is counted in a CommCounter.
//
// Point-to-point semantics (every backend; docs/architecture.md, Communication):
// - Messages between two ranks are matched in posting order per (source, destination, tag), as
//   MPI's; p2p has its own order per channel and does not advance the collectives' sequence.
// - A send is a rendezvous: it completes only once the matching recv has been posted and the
//   bytes are copied (NCCL's ncclSend, MPI's synchronous mode). Nothing is buffered, so two ranks
//   that both send first and receive after, outside one batch, deadlock as they would on NCCL:
//   ptool reports it (a timeout; nccl at once, from the descriptors it exchanges) instead of
//   passing where the threads backend could buffer.
// - batch_isend_irecv posts every op, then completes them all (ncclGroupStart/End; torch's
//   batch_isend_irecv): ranks that send to each other in one batch never deadlock.
// - A matched pair must agree on dtype and shape; the recv's tensor says what it expects. A
//   mismatch, or an op whose peer never posts its match within the communicator's timeout, is a
//   RuntimeError naming both ranks (world ranks), the tag and both descriptors; a rank waiting in
//   p2p is woken when another rank fails, as in a collective. A peer equal to this rank, or
//   outside the group, is a RuntimeError (torch refuses it too). Empty tensors travel.
// - Counted in the CommCounter as ops "send" and "recv" with the tensor's bytes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_stats.h"
#include "core/tensor.h"
#include "core/tensor_ops.h"  // Chunk, chunk_of

namespace ptool {

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

struct CommOptions {
    double timeout_seconds = 300;  // per collective; 0: none (mpi: waiting for rank 0's own work)
    bool check_consistency = true;
};

// One point-to-point op of batch_isend_irecv, as torch.distributed.P2POp.
struct P2POp {
    enum class Kind { send, recv };
    Kind kind;
    Tensor* tensor;  // send: read; recv: written (its shape and dtype are what it expects)
    int peer;        // a rank of this communicator
    int tag = 0;     // >= 0
};

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string backend() const = 0;  // "threads", "mpi"

    virtual void all_reduce(Tensor& t, ReduceOp op) = 0;
    virtual void all_gather(const Tensor& in, Tensor& out) = 0;
    virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
    virtual void broadcast(Tensor& t, int root) = 0;
    virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
    // all_to_all with uneven splits along dim 0 (torch's all_to_all_single with input_split_sizes
    // and output_split_sizes; MoE's token dispatch and combine): in's rows go in order, send_rows[j]
    // of them to rank j; out receives recv_rows[j] rows from rank j, in rank order. Rows are the
    // same size on every rank. Every rank's send_rows[j] must equal rank j's recv_rows[this rank]:
    // otherwise every rank raises the same RuntimeError (mismatch) naming the first pair of ranks
    // that disagree. Counted as "all_to_all" with in's bytes.
    virtual void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                              const std::vector<int64_t>& recv_rows) = 0;
    virtual void barrier() = 0;
    virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
    // split, where the caller knows the group it makes (this rank's place and the group's size, as
    // a mesh does): a simulated rank builds the group from that alone. Collective like split.
    virtual std::unique_ptr<Communicator> split_known(int color, int key, int /*group_rank*/,
                                                      int /*group_size*/) {
        return split(color, key);
    }

    // Point-to-point (semantics above). send and recv are a batch of one op.
    virtual void send(const Tensor& t, int peer, int tag = 0);
    virtual void recv(Tensor& t, int peer, int tag = 0);
    // Posts every op, then completes them all (NCCL's group semantics, torch's batch_isend_irecv):
    // ranks that send to each other in one batch never deadlock.
    virtual void batch_isend_irecv(const std::vector<P2POp>& ops) = 0;

    // Where this communicator counts its collectives, and the mesh dim name it counts them under.
    void set_counter(std::shared_ptr<CommCounter> counter, std::string label) {
        counter_ = std::move(counter);
        label_ = std::move(label);
    }
    const std::shared_ptr<CommCounter>& counter() const { return counter_; }

protected:
    void count(Collective op, int64_t bytes) {
        if (counter_) counter_->add(op, label_, bytes);
    }
    void count_p2p(const std::vector<P2POp>& ops);  // "send" / "recv" with each tensor's bytes

private:
    std::shared_ptr<CommCounter> counter_;
    std::string label_;
};

// Elements per dim-0 row, from the shape (so a tensor with zero rows still has a row size).
int64_t row_numel(const Tensor& t);

// reduce_scatter's contract: rank `index` of `parts` receives its chunk of in's dim-0 rows; out
// must hold exactly that many rows (RuntimeError naming the shapes otherwise).
struct RowChunk {
    int64_t rows, row;  // in's dim-0 rows, elements per row
    Chunk chunk;        // this rank's rows
};
RowChunk reduce_scatter_rows(const Tensor& in, const Tensor& out, int parts, int index);

// outs[k][i] = reduce over ranks r = 0..n-1 (in that order) of inputs[r][i], in acc_t<T>, one
// rounding; the result is stored to every out (an out may alias an input at the same offset).
void reduce_in_rank_order(const std::vector<const void*>& inputs, const std::vector<void*>& outs,
                          int64_t count, DType dtype, ReduceOp op);

// all_to_all_v's checks. Local, before anything is posted (RuntimeError, misuse): a split per
// rank, none negative, in and out hold exactly the rows their splits add up to, the same row size
// and dtype. Across ranks: sends[r][j] (rank r's send_rows) against recvs[j][r]; the message of the
// first pair that disagrees, in rank order (every rank computes the same), or "" when all agree.
// world(r): group rank r's world rank.
void check_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                        const std::vector<int64_t>& recv_rows, int size);
std::string all_to_all_v_mismatch(const std::vector<std::vector<int64_t>>& sends,
                                  const std::vector<std::vector<int64_t>>& recvs,
                                  const std::function<int(int)>& world);

// A collective's identity, compared across ranks before it runs: "all_reduce#10 float32 [16, 10]".
struct CollectiveDesc {
    int op = 0;  // a Collective, or kCollectives + the index of an op of no row (collective_common.cpp)
    int dtype = 0;
    int ndim = 0;
    int64_t dims[8] = {};
    int64_t sequence = 0;
    int64_t root = -1;
    int64_t shape_free = 0;  // all_gather: dim 0 may differ between ranks

    bool matches(const CollectiveDesc& other) const;
    std::string str() const;
};
// By name: a collective of the table (comm/collective.h), or an op of none: all_to_all_v's
// descriptor (it counts as all_to_all), and, without a tensor, barrier, split and init.
CollectiveDesc describe(const char* op, const Tensor& t, int64_t sequence, int64_t root = -1,
                        bool dim0_free = false);
CollectiveDesc describe(const char* op, int64_t sequence);  // no tensor: barrier, split, init
// A collective of the table (comm/collective.h) by its enum.
CollectiveDesc describe(Collective op, const Tensor& t, int64_t sequence, int64_t root = -1,
                        bool dim0_free = false);

}  // namespace ptool
