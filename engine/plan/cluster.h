// A cluster file (clusters/*.yaml): what the planner and the time model know about the machines a
// plan will run on. GPUs per node and nodes, memory per GPU, peak dense FLOP/s per dtype, the share
// of it large GEMMs reach, memory bandwidth, and the two link classes a collective can cross:
// inside a node (NVLink) and across nodes (InfiniBand/RoCE), each as per-GPU bandwidth per direction
// and latency. docs/planning.md has the format and where each number comes from.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace ptool {

struct Link {
    double bandwidth = 0;  // bytes/s per GPU per direction (nccl-tests' busbw of a ring at large sizes)
    double latency = 0;    // seconds per ring hop
};

// Device memory a training process holds besides its tensors (docs/planning.md has the sources);
// plan/device_overheads.h adds it up per rank. All zero when the cluster file has no `runtime`.
struct RuntimeMemory {
    double cuda_context = 0;  // bytes: the CUDA context at the process's first CUDA call
    // bytes a training process adds outside its caching allocator once it has run a step: kernel
    // modules loaded lazily, cuBLAS's and NCCL's handles (measured: the device's used bytes after a
    // step less max_memory_reserved and the context)
    double step_runtime = 0;
    // bytes of one cuBLAS workspace; PyTorch allocates one per thread that runs GEMMs (the forward's
    // and autograd's) through its caching allocator: counted in allocated and reserved
    double cublas_workspace = 0;
    double nccl_per_communicator = 0;  // bytes: one NCCL communicator's channel buffers
};

struct KernelTable;

struct Cluster {
    std::string name, path;
    int nodes = 1;
    int gpus_per_node = 1;
    double memory_bytes = 0;    // per GPU
    double reserved_bytes = 0;  // per GPU, held back besides `runtime` (a margin; 0 by default)
    RuntimeMemory runtime;
    std::map<DType, double> flops;  // peak dense FLOP/s per compute dtype
    // peak dense float8 FLOP/s (torch._scaled_mm's tensor cores, sm_89+); 0: the GPU has none and
    // cannot run float8 linears (`tflops` names no `float8`)
    double float8_flops = 0;
    double gemm_efficiency = 1;  // the roofline's share of peak (a cluster without a kernel table)
    // the kernel table its GPU's kernels are priced by (plan/kernel_model.h); null: the roofline
    std::shared_ptr<const KernelTable> kernels;
    std::string kernels_path;     // the file it was read from ("" without one): an input of the command
    double memory_bandwidth = 0;  // bytes/s: what the other ops are bound by
    Link intra, inter;
    int world_size() const { return nodes * gpus_per_node; }
    double peak_flops(DType dt) const;  // InputError-free: 0 when the file names no rate for dt
    bool has_float8() const { return float8_flops > 0; }
    // Why the cluster cannot run float8 linears, one clause naming it ("" when it can).
    std::string no_float8() const;
};

Cluster load_cluster(const std::string& path);
Cluster load_cluster_text(const std::string& text, const std::string& name);

}  // namespace ptool
