// The nccl communicator: one rank per GPU, collectives through NCCL (docs/architecture.md, GPUs).
//
// Two launchers, one class:
//   in-process  N rank threads, one per GPU, when the process sees >= N GPUs (run_nccl_threads);
//   mpirun      one process per GPU (the node-local rank picks the GPU), the NCCL unique id
//               broadcast over the MPI communicator (make_nccl_world).
// Mesh dims are ncclCommSplit of the world.
//
// Numerics (decision): NCCL only moves bytes. A reduction is NCCL send/recv of chunks (chunk j
// of every rank's tensor to rank j: the traffic of a ring reduce-scatter), ptool's rank-order
// reduction kernel on the received chunks (comm/device_reduce.h), and an ncclAllGather: the
// results are bitwise those of the threads, mpi and cuda_local communicators, so a plan's
// verdicts do not depend on which one ran it.
//
// Failures never hang: communicators are created non-blocking, and every wait polls the stream,
// ncclCommGetAsyncError, the job's abort flag (in-process) and a deadline; on a timeout or an
// abort the communicator is ncclCommAbort-ed and the rank throws (exit 3, naming the rank and
// the collective). The consistency check all-gathers every rank's collective descriptor first.
// Host tensors (BatchNorm's statistics) are staged through device memory.
//
// Point-to-point is ncclSend/ncclRecv inside ncclGroupStart/End, in two groups: descriptors
// (dtype, shape, tag, send or recv) both ways first, then the bytes. Each rank sends its
// descriptor of every op to the op's peer and receives the peer's, so a send completes only once
// its recv is posted (a rendezvous whatever NCCL buffers) and both ranks check the same pairs.
// NCCL pairs ops by posting order and knows no tags: the descriptors pair each op with the peer's
// first op of the same tag, and the receives of the bytes are posted in the sender's order. Tags
// therefore reorder within one batch; across separate calls two ranks must post their ops with
// each other in the same order (as on NCCL itself: the descriptors name the op posted instead).
// Unverified on a GPU at the time of writing (no GPU where it was written).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/comm_threads.h"
#include "comm/communicator.h"

namespace ptool {

struct NcclId {
    char bytes[128];  // ncclUniqueId (NCCL_UNIQUE_ID_BYTES), opaque so this header needs no nccl.h
};
NcclId nccl_unique_id();  // RuntimeError when NCCL cannot be loaded

class NcclCommunicator final : public Communicator {
public:
    // Every rank calls this with the same id, on the thread (and so the GPU) it will use. abort:
    // the job's shared flag when ranks are threads of one process, null under mpirun.
    NcclCommunicator(const NcclId& id, int rank, int size, CommOptions options,
                     std::shared_ptr<AbortState> abort);
    ~NcclCommunicator() override;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string backend() const override { return "nccl"; }

    void all_reduce(Tensor& t, ReduceOp op) override;
    void all_gather(const Tensor& in, Tensor& out) override;
    void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
    void broadcast(Tensor& t, int root) override;
    void all_to_all(const Tensor& in, Tensor& out) override;
    void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                      const std::vector<int64_t>& recv_rows) override;
    void barrier() override;
    std::unique_ptr<Communicator> split(int color, int key) override;
    void batch_isend_irecv(const std::vector<P2POp>& ops) override;

private:
    NcclCommunicator(void* comm, int rank, int size, CommOptions options, std::shared_ptr<AbortState> abort,
                     std::vector<int> world_ranks);
    // Waits until the communicator's pending work and this thread's stream are done.
    void await(const CollectiveDesc& d, bool stream = true);
    // The same for any wait: `what` names it in activity and error messages; timeout() is the
    // timeout's message.
    void await(const std::string& what, bool stream, const std::function<RuntimeError()>& timeout);
    // Aborts the communicator and throws; a message of kind other gets "rank R: " in front.
    [[noreturn]] void fail(const std::string& message, RuntimeError::Kind kind = RuntimeError::Kind::other);
    std::vector<char> exchange(const CollectiveDesc& d, const void* mine,
                               size_t bytes);  // all-gather of host bytes
    std::vector<CollectiveDesc> check(const CollectiveDesc& d, bool always = false);
    // Rank-order reduction of chunk rank() (chunk_of over rows) of every rank's device buffer in into out.
    void reduce_chunk(const void* in, void* out, int64_t rows, int64_t row, DType dtype, ReduceOp op,
                      const CollectiveDesc& d);

    void* comm_;  // ncclComm_t; null once aborted
    int rank_, size_;
    CommOptions options_;
    std::shared_ptr<AbortState> abort_;
    std::vector<int> world_ranks_;  // member i's rank in the job, for messages
    int64_t sequence_ = 0;
};

// Runs fn(comm) on n rank threads, rank r on GPU r, over one NCCL communicator; failures as
// run_rank_threads.
void run_nccl_threads(int n, const CommOptions& options, const std::function<void(Communicator&)>& fn);

// The GPU world of an mpirun job, on the calling thread's GPU (comm_choice.h: gpu_for_local_rank);
// the NCCL id travels over bootstrap (the MPI world).
std::unique_ptr<Communicator> make_nccl_world(Communicator& bootstrap, const CommOptions& options);

}  // namespace ptool
