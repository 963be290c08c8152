// A rank's device memory besides its tensors, from the cluster file's `runtime` (plan/cluster.h):
// the CUDA context, cuBLAS's workspace and one set of NCCL buffers per communicator the rank
// joins. Communicators as PyTorch creates them for a DeviceMesh: one per mesh dim of more than one
// rank that the plan's roles use for collectives (dp_replicate, dp_shard, cp, tp, ep), the flattened
// dp_shard x cp group fully_shard runs on under context parallel (torchtitan's dp_shard_cp), and for
// pipeline parallelism one per peer the rank sends to or receives from (ProcessGroupNCCL's
// send/recv makes a 2-rank communicator per pair: the previous and the next stage's rank, and
// with virtual stages the last rank's and the first's to each other). A dim without a role holds
// replicas that never communicate: none. The world group is not counted (torchtitan runs no
// collective on it during training). docs/planning.md has the sources of the numbers.
#pragma once

#include "parallel/plan.h"
#include "plan/cluster.h"

namespace ptool {

struct DeviceOverheads {
    double cuda_context = 0, step_runtime = 0, nccl = 0;  // bytes, outside the caching allocator
    // bytes inside it: PyTorch's cuBLAS workspaces, one per thread that runs GEMMs (the forward's and
    // autograd's), allocated at their first GEMM and kept: in allocated and reserved
    double cublas_workspaces = 0;
    int communicators = 0;
    double outside_allocator() const { return cuda_context + step_runtime + nccl; }
    double total() const { return outside_allocator() + cublas_workspaces; }
};
constexpr int kCublasWorkspaces = 2;  // the forward thread's and autograd's

int nccl_communicators(const Plan& plan, int rank);
DeviceOverheads device_overheads(const Cluster& cluster, const Plan& plan, int rank);
// The largest over the plan's ranks (what a cap for every rank must leave).
DeviceOverheads worst_device_overheads(const Cluster& cluster, const Plan& plan);

}  // namespace ptool
