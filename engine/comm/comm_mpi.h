// The MPI communicator (OpenMPI): one process per rank, started by mpirun or srun.
//
// Collectives are nonblocking MPI calls polled against a deadline, so a stuck rank ends the job
// (MPI_Abort, exit 3) with a message instead of hanging. Reductions are an all-to-all of chunks
// followed by the same rank-order reduction the threads communicator uses and an all-gather:
// results are bitwise those of the threads communicator. The consistency check all-gathers each
// rank's collective descriptor first.
//
// Point-to-point is synchronous-mode MPI (MPI_Issend: complete once the matching receive has been
// posted, NCCL's rendezvous) on two tags per ptool tag: the message's descriptor (dtype, shape)
// first, then its bytes. The receiver reads the descriptor, compares it with its tensor and only
// then posts the receive of the bytes straight into the tensor (a mismatched message's bytes are
// drained into a scratch buffer). Every request is polled against the deadline; a given-up op's
// requests are cancelled (receives) or left to MPI with their buffers kept alive (sends), so a
// late match never touches freed memory. Failures throw RuntimeError (exit 3 through the CLI).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ptool {

struct MpiP2P;  // one point-to-point op in flight (comm_mpi.cpp)

bool launched_by_mpi();  // mpirun/srun set the environment ptool checks
void mpi_init_once();    // MPI_Init_thread, and MPI_Finalize at exit
int mpi_world_rank();
[[noreturn]] void mpi_abort_job(const std::string& message, int code);  // prints, then MPI_Abort
std::string mpi_error_string(int code);  // MPI's words for an error code (PTOOL_CHECK_MPI, core/check.h)

class MpiCommunicator final : public Communicator {
public:
    MpiCommunicator(MPI_Comm comm, CommOptions options);  // takes a duplicate of comm
    ~MpiCommunicator() override;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string backend() const override { return "mpi"; }

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
    // Posts a batch's ops into `batch` and polls them to completion; throws leaving them posted.
    void post_and_complete(std::vector<MpiP2P>& batch, const std::vector<P2POp>& ops);
    void check(const CollectiveDesc& d);
    void wait(MPI_Request& req, const CollectiveDesc& d);
    // Rank-ordered reduction of rows [chunk r] of every rank's in into out (this rank's chunk).
    void reduce_chunk(const Tensor& in, void* out, int64_t rows, int64_t row, ReduceOp op,
                      const CollectiveDesc& d);

    MPI_Comm comm_;
    int rank_ = 0, size_ = 1;
    std::vector<int> world_ranks_;  // member i's rank in MPI_COMM_WORLD, for p2p messages
    int tag_ub_ = 32767;            // MPI_TAG_UB: ptool tag t uses MPI tags 2t and 2t + 1
    CommOptions options_;
    int64_t sequence_ = 0;
};

}  // namespace ptool
