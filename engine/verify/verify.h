// ptool verify: one reference run, each plan's parallel run, and their comparison tensor by tensor
// and step by step, with replica consistency and the localisation of the first divergence.
#pragma once

#include <optional>

#include "comm/communicator.h"
#include "verify/compare.h"
#include "verify/parallel_run.h"

namespace ptool {

struct TensorReport {
    std::string name;  // golden name: step0.grad.net1.weight
    TensorDiff diff;
    std::string replicas;  // "equal", "DIFFER", or "-" (sharded)
    bool pass = true;
};

struct PlanReport {
    std::string plan_path;
    std::vector<std::string> warnings;
    std::vector<TensorReport> tensors;
    int passed = 0, failed = 0;
    bool pass = true;
    std::string localisation;  // "first divergence: ..." when something failed
    std::vector<std::string> notes;   // replica invariants; the expected causes of a mismatch
    RunRecord run;             // counts, time, world size
    Tolerance tol;
};

struct VerifyReport {
    std::vector<PlanReport> plans;
    RunRecord reference;  // the reference run (of the last plan's step count)
    double reference_seconds = 0;
    bool pass = true;
};

struct VerifyOptions {
    std::optional<double> rtol, atol;  // command line: over the plan's, over the dtype's
    int64_t steps = 0;                 // command line: over the plan's, over the model's
    CommOptions comm;
};

// Runs everything in this process: the reference, then each plan on rank threads.
VerifyReport verify_in_process(const VerifyInputs& in, const std::vector<Plan>& plans, const VerifyOptions& opt);

// Under mpirun: every process calls this with the MPI world; rank 0 runs the reference first,
// compares the parallel run as it is gathered, and gets the report.
VerifyReport verify_on_world(Communicator& world, const VerifyInputs& in, const std::vector<Plan>& plans,
                             const VerifyOptions& opt);

// Compares a parallel run with the reference (rank 0 side).
PlanReport compare_runs(const RunRecord& reference, const RunRecord& parallel, const Plan& plan, const Tolerance& tol);

int64_t steps_for(const VerifyInputs& in, const Plan& plan, const VerifyOptions& opt, int64_t model_steps);
Tolerance tolerance_for(const Plan& plan, const VerifyOptions& opt, const Model& model);

}  // namespace ptool
