// Which communicator a job runs on, and which GPU a process takes (docs/architecture.md, GPUs). Pure logic
// over the device, the rank count, the visible GPUs and the launcher's environment, so it is tested on
// machines without a GPU.
//
//   --device cpu                          threads (in-process) | mpi (mpirun)
//   --device cuda, ranks <= visible GPUs  nccl: rank r on GPU r (in-process) | mpirun: one GPU per process
//   --device cuda, more ranks than GPUs   cuda_local: every rank a thread on the process's GPU
//   one rank                              threads / cuda_local (no collective crosses a device)
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"

namespace ptool {

class CoreSlots;  // comm/comm_threads.h

enum class CommKind { threads, cuda_local, nccl };
const char* comm_kind_name(CommKind kind);
CommKind in_process_comm(Device device, int ranks, int visible_gpus);

// The process's rank among those of its node, and their count, from the launcher's environment
// (OpenMPI's OMPI_COMM_WORLD_LOCAL_RANK/_SIZE, Slurm's SLURM_LOCALID/SLURM_NTASKS_PER_NODE,
// MPICH's MPI_LOCALRANKID/MPI_LOCALNRANKS); -1 where it does not say.
struct LocalRank {
    int rank = -1, size = -1;
};
LocalRank launcher_local_rank();

// The GPU an mpirun process with --device cuda takes: its node-local rank. InputError when the
// launcher does not say which rank this is on its node or starts more ranks on a node than it has
// GPUs (NCCL runs one rank per GPU; cuda_local is the in-process way to put several on one).
int gpu_for_local_rank(LocalRank local, int visible_gpus);

// Runs fn(comm) on n in-process ranks over in_process_comm(device, n, visible GPUs). `cores`: CPU
// rank threads of jobs that run at once (verify's reference beside its parallel run) take turns on
// one set of cores, and the caller sets OpenBLAS's share (GemmThreadShare) for all of them.
void run_ranks(int n, const CommOptions& options, const std::function<void(Communicator&)>& fn, Device device,
               std::shared_ptr<CoreSlots> cores = nullptr);

}  // namespace ptool
