// Device memory besides the tensors' bytes: PyTorch's caching-allocator policy replayed on a
// run's allocations (core/allocator_model.h) and the runtime's memory per rank
// (plan/device_overheads.h) from a cluster file's `runtime`.

#include "core/allocator_model.h"
#include "core/error.h"
#include "parallel/plan.h"
#include "plan/cluster.h"
#include "plan/device_overheads.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_device_memory {

namespace {
constexpr size_t MiB = size_t{1} << 20;
}

TEST_CASE(
    "the allocator model reserves PyTorch's segments: 2 MiB small, 20 MiB under 10 MiB, else 2 MiB-rounded",
    "[cpu]") {
    AllocatorModel m;
    int k[8];
    m.allocate(&k[0], 1000);  // small pool: a 2 MiB segment
    CHECK(m.reserved() == 2 * MiB);
    m.allocate(&k[1], 1 * MiB);  // still small (at most 1 MiB): the same segment's rest
    CHECK(m.reserved() == 2 * MiB);
    m.allocate(&k[2], MiB / 2 * 3);  // large, under 10 MiB: the small pool's free bytes never serve it
    CHECK(m.reserved() == 22 * MiB);
    m.allocate(&k[3], 3 * MiB);  // from that segment's rest, split off (18.5 MiB left)
    CHECK(m.reserved() == 22 * MiB);
    m.allocate(&k[4], 11 * MiB);  // best fit: the rest again (6.5 MiB left)
    CHECK(m.reserved() == 22 * MiB);
    m.allocate(&k[5], 15 * MiB);  // 10 MiB or more: its own segment, rounded up to 2 MiB
    CHECK(m.reserved() == 38 * MiB);
    m.release(&k[5]);
    m.allocate(&k[5], 17 * MiB);  // the cached 16 MiB block is too small: an 18 MiB segment
    CHECK(m.reserved() == 56 * MiB);
    CHECK(m.peak_reserved() == 56 * MiB);
    m.allocate(&k[6], 6 * MiB);  // best fit: the 6.5 MiB rest, not the cached 16 MiB block
    CHECK(m.reserved() == 56 * MiB);
    // freed blocks merge with their free neighbours: the 20 MiB segment is whole again
    m.release(&k[2]), m.release(&k[3]), m.release(&k[4]), m.release(&k[6]);
    m.allocate(&k[7], 19 * MiB);  // the whole 20 MiB segment (a 1 MiB rest is not split off)
    CHECK(m.reserved() == 56 * MiB);
    m.release(&k[0]), m.release(&k[1]), m.release(&k[5]), m.release(&k[7]);
    CHECK(m.reserved() == 56 * MiB);  // cached, not returned: what max_memory_reserved reports
    m.release(&k[7]);                 // twice, or never allocated: ignored
    CHECK(m.over_capacity() == 0);
}

TEST_CASE("the allocator model gives its cache back before a segment would cross the capacity", "[cpu]") {
    AllocatorModel m(64 * MiB);
    int a, b, c;
    m.allocate(&a, 40 * MiB);
    m.release(&a);             // cached: 40 MiB reserved, none in use
    m.allocate(&b, 50 * MiB);  // 40 + 50 > 64: the cached segment goes back, then 50 fits
    CHECK(m.reserved() == 50 * MiB);
    CHECK(m.over_capacity() == 0);
    m.allocate(&c, 30 * MiB);  // 50 in use + 30 > 64 with nothing cached: granted, counted
    CHECK(m.over_capacity() == 1);
    CHECK(m.peak_reserved() == 80 * MiB);
}

TEST_CASE("restart replays what is live in allocation order and forgets the transients", "[cpu]") {
    AllocatorModel m;
    int whole, shard, other;
    m.allocate(&whole, 100 * MiB);  // a model built whole, then sharded
    m.allocate(&shard, 30 * MiB);
    m.allocate(&other, 4000);
    m.release(&whole);
    CHECK(m.peak_reserved() == 132 * MiB);
    m.restart();
    CHECK(m.reserved() == 32 * MiB);  // the shard's 30 MiB segment and a small one
    CHECK(m.peak_reserved() == 32 * MiB);
    m.release(&shard), m.release(&other);
    CHECK(m.reserved() == 32 * MiB);
}

TEST_CASE("a rank joins one NCCL communicator per collective dim and one per pipeline peer", "[cpu]") {
    const Cluster cl = load_cluster_text(
        "nodes: 1\ngpus_per_node: 8\nmemory_gib: 80\ntflops: {bfloat16: 989}\nmemory_bandwidth_gb_s: 3350\n"
        "intra_node: {bandwidth_gb_s: 450, latency_us: 3}\n"
        "runtime: {cuda_context_mib: 500, step_runtime_mib: 700, cublas_workspace_mib: 32, "
        "nccl_mib_per_communicator: 100}\n",
        "c.yaml");
    const std::string tp = "tensor_parallel: {mesh_dim: tp, plan: {net1: colwise}}\n";
    const Plan dp_tp = load_plan_text(
        "mesh: {dp: 2, tp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n" + tp, "p.yaml");
    CHECK(nccl_communicators(dp_tp, 0) == 2);
    const DeviceOverheads o = device_overheads(cl, dp_tp, 3);
    CHECK(o.cuda_context == 500.0 * MiB);
    CHECK(o.step_runtime == 700.0 * MiB);
    CHECK(o.cublas_workspaces == 64.0 * MiB);  // the forward thread's and autograd's, in the allocator
    CHECK(o.nccl == 200.0 * MiB);
    CHECK(o.outside_allocator() == 1400.0 * MiB);
    CHECK(o.total() == 1464.0 * MiB);
    // a dim of one rank, or without a role (replicas that never talk), has none
    CHECK(nccl_communicators(
              load_plan_text("mesh: {dp: 1, tp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n" + tp,
                             "p.yaml"),
              0) == 1);
    CHECK(nccl_communicators(load_plan_text("mesh: {r: 2, tp: 2}\n" + tp, "p.yaml"), 0) == 1);
    // HSDP: the replicate and the shard dims
    CHECK(nccl_communicators(
              load_plan_text(
                  "mesh: {dp_replicate: 2, dp_shard: 2}\ndata_parallel: {mesh_dim: [dp_replicate, dp_shard], "
                  "mode: fully_shard}\n",
                  "p.yaml"),
              0) == 2);
    // 1F1B over pp 4 with dp 2 (pp outermost): the first and last stages have one peer, the middle two
    const Plan pp = load_plan_text(
        "mesh: {pp: 4, dp: 2}\npipeline_parallel: {mesh_dim: pp, schedule: 1f1b, microbatches: 4}\n"
        "data_parallel: {mesh_dim: dp, mode: replicate}\n",
        "p.yaml");
    CHECK(nccl_communicators(pp, 0) == 1 + 1);
    CHECK(nccl_communicators(pp, 2) == 1 + 2);
    CHECK(nccl_communicators(pp, 5) == 1 + 2);
    CHECK(nccl_communicators(pp, 7) == 1 + 1);
    CHECK(worst_device_overheads(cl, pp).communicators == 3);
    // interleaved: the last rank sends its stage's output on to the first rank's next stage
    const Plan v2 = load_plan_text(
        "mesh: {pp: 4}\npipeline_parallel: {mesh_dim: pp, schedule: interleaved_1f1b, virtual_stages: 2, "
        "microbatches: 4}\n",
        "p.yaml");
    CHECK(nccl_communicators(v2, 0) == 2);
    CHECK(nccl_communicators(v2, 3) == 2);
    const Plan v2_pp2 = load_plan_text(
        "mesh: {pp: 2}\npipeline_parallel: {mesh_dim: pp, schedule: interleaved_1f1b, virtual_stages: 2, "
        "microbatches: 2}\n",
        "p.yaml");
    CHECK(nccl_communicators(v2_pp2, 0) == 1);
}

TEST_CASE("a cluster file's runtime is optional, in MiB, and strict", "[cpu]") {
    const std::string base =
        "nodes: 1\ngpus_per_node: 8\nmemory_gib: 80\ntflops: {bfloat16: 989}\nmemory_bandwidth_gb_s: 3350\n"
        "intra_node: {bandwidth_gb_s: 450, latency_us: 3}\n";
    const Cluster none = load_cluster_text(base, "c.yaml");
    CHECK(none.runtime.cuda_context == 0);
    CHECK(none.runtime.nccl_per_communicator == 0);
    const Cluster some = load_cluster_text(base + "runtime: {cublas_workspace_mib: 8.125}\n", "c.yaml");
    CHECK(some.runtime.cublas_workspace == 8.125 * MiB);
    CHECK(some.runtime.cuda_context == 0);
    CHECK_THROWS_WITH(load_cluster_text(base + "runtime: {cuda_context_mb: 5}\n", "c.yaml"),
                      Catch::Contains("c.yaml:7:") && Catch::Contains("cuda_context_mb"));
    CHECK_THROWS_WITH(load_cluster_text(base + "runtime: {nccl_mib_per_communicator: -1}\n", "c.yaml"),
                      Catch::Contains("c.yaml:7:") && Catch::Contains("must be in [0"));
    CHECK_THROWS_WITH(load_cluster_text(base + "runtime: {cuda_context_mib: 81920}\n", "c.yaml"),
                      Catch::Contains("c.yaml:7:") && Catch::Contains("leave no memory"));
    CHECK_THROWS_WITH(load_cluster_text(base + "runtime: [1]\n", "c.yaml"), Catch::Contains("c.yaml:7:"));
}

}  // namespace test_device_memory
