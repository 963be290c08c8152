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
    // In-process verify knows what a parallel run is compared with before it starts. Rank 0 then
    // compares each tensor as soon as it is gathered and keeps the diff (StepRecord::vs_reference,
    // vs_golden; ModuleEvent::diff), not the tensor: the run holds one gathered tensor at a time
    // instead of every step's state. Null: the tensors are recorded (mpirun, the reference).
    const RunRecord* compare_with = nullptr;  // the reference's record
    const TensorFile* golden = nullptr;       // a golden file (--golden, replay)
    Tolerance tol;                            // the plan's (tolerance_for)
};

// out: filled on rank 0 of world only.
void run_parallel_rank(Communicator& world, const VerifyInputs& in, const Plan& plan, const Fault& fault, RunRecord* out);

// The reference, recorded the same way.
RunRecord run_reference_record(const VerifyInputs& in);

}  // namespace ptool
