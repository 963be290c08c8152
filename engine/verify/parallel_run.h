// One rank of a parallel run: builds its model, mesh and shards, trains the steps on its part of
// the batch, and gathers everything to full size (uncounted) so rank 0 can compare it with the
// reference. Every rank calls run_parallel_rank at the same time (threads or MPI processes).
#pragma once

#include "core/safetensors.h"
#include "parallel/parallelize.h"
#include "verify/run_record.h"

namespace ptool {

struct VerifyInputs {
    std::string model_path, model_text, dtype_override;
    const TensorFile* init = nullptr;
    std::string init_path;
    const TensorFile* data = nullptr;
    std::string data_path;
    int64_t steps = 1;
    bool record_events = true;
    // Where the ranks compute (--device). cuda: every rank thread on one GPU with its own stream,
    // collectives through cuda_local; recorded tensors are copied to the host for comparison.
    Device device = Device::cpu;
};

// out: filled on rank 0 of world only.
void run_parallel_rank(Communicator& world, const VerifyInputs& in, const Plan& plan, const Fault& fault, RunRecord* out);

// The reference, recorded the same way.
RunRecord run_reference_record(const VerifyInputs& in);

}  // namespace ptool
