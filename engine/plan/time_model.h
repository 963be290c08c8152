// The time model: a rank's training step on a cluster (plan/cluster.h), from what simulating it
// counted (train/simulate.h): its GEMM FLOPs, the bytes its other ops touch, and its collectives
// per mesh dim.
//
//   compute  = the kernel model's seconds of the counted work (plan/kernel_model.h): each GEMM
//              shape and fused attention from the cluster's kernel table, memory-bound bytes at its
//              measured bandwidth (without a table: FLOPs at gemm_efficiency of peak, bytes at the
//              memory bandwidth)
//   a collective over n ranks moving B bytes (CommCounter's logical size), as nccl-tests' ring:
//            bus factor(n) B / bw + calls x hops(n) latency, from the collective's row (comm/collective.h):
//            all_reduce      2(n-1)/n B / bw + 2(n-1) latency
//            all_gather, reduce_scatter, all_to_all   (n-1)/n B / bw + (n-1) latency
//            broadcast       B / bw + (n-1) latency
//   bw and latency are the intra-node link's when every group of that mesh dim sits inside a node
//   (ranks are numbered row-major over the mesh and fill nodes in order), else the inter-node link's.
//   step     = compute + blocking + max(0, overlappable - compute)
// where overlappable is the data-parallel mesh dim's collectives (DDP's buckets and fully_shard's
// gathers and reduce-scatters run on their own stream beside the compute, as PyTorch's do) and
// blocking the rest (tensor parallel's sit between the ops that need them). docs/planning.md.
#pragma once

#include <map>
#include <string>

#include "backend/meta/meta_backend.h"
#include "comm/comm_stats.h"
#include "parallel/plan.h"
#include "plan/cluster.h"
#include "plan/kernel_model.h"

namespace ptool {

struct CommTime {
    double seconds = 0;
    double bytes = 0;  // logical bytes (CommCounter's)
    int64_t calls = 0;
    bool inter_node = false;
};

struct StepTime {
    double compute = 0, blocking = 0, overlappable = 0, step = 0;
    ComputeTerms terms;  // compute, term by term
    // a pipeline's: its schedule's critical path (compute, blocking collectives and transfers), and
    // the bubble, idle time over the busiest rank's forward and backward work (plan/pipeline_time.h)
    double pipeline = 0, bubble = 0;
    double gemm_flops = 0;   // executed, recompute included
    double model_flops = 0;  // the training step's own (without activation checkpointing's recompute): MFU's
    // expert parallel's dispatch and combine (all_to_all over the dim ep borrows), part of blocking
    double all_to_all = 0;
    std::map<std::string, CommTime> by_dim;  // mesh dim -> its collectives
};

// Whether every group along mesh dim `dim` of `plan` lies inside one node of `c`.
bool dim_inside_node(const Plan& plan, const std::string& dim, const Cluster& c);
// The link a collective along `dim` runs at: the node's (NVLink) inside one; across nodes NCCL
// runs a ring per NIC (one channel per rail) and every rank of the group in a node drives its own,
// so the busbw is inter-node's per-GPU bandwidth times the group's ranks per node, at most NVLink's.
Link collective_link(const Plan& plan, const std::string& dim, const Cluster& c);
// The ring cost of `calls` collectives `op` moving `bytes` in total over n ranks on `link`.
double collective_seconds(Collective op, double bytes, int64_t calls, int n, const Link& link);

// The seconds of `work` on one GPU of `c` in `compute` (InputError when the cluster has no peak for
// it): compute_terms(...).total().
double compute_seconds(const MetaWork& work, const Cluster& c, DType compute);
// Adds `comm`'s collectives to t.by_dim and to t.blocking or t.overlappable (a pipeline's sends and
// receives to t.by_dim only: they are on its critical path, plan/pipeline_time.h).
void add_comm_time(StepTime& t, const CommByOpDim& comm, const Plan& plan, const Cluster& c);
// The seconds of one send or receive of `bytes` over the pp dim's link.
double p2p_seconds(double bytes, const Plan& plan, const Cluster& c);

StepTime predict_step_time(const MetaWork& work, const CommByOpDim& comm, const Plan& plan, const Cluster& c,
                           DType compute);
// MFU: model FLOPs per second over the peak of the compute dtype.
double mfu(const StepTime& t, const Cluster& c, DType compute);

}  // namespace ptool
