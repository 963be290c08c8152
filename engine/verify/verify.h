// ptool verify: one reference run per step count, each plan's parallel run, and their comparison
// tensor by tensor and step by step, with replica consistency and the localisation of the first
// divergence; optionally three ways, against a golden file. The same code runs in one process
// (rank threads) and under mpirun (one process per rank): only the Launch differs.
#pragma once

#include <memory>

#include "verify/faults.h"
#include "verify/recorder.h"
#include "verify/report.h"

namespace ptool {

struct VerifyOptions {
    int64_t steps = 0;              // over the plan's, over the model's
    Tolerance::Override tolerance;  // over the plan's, over the dtype's
    CommOptions comm;
    bool events = true;  // localisation's per-module gathers (benches measure without them too)
    bool strict =
        false;  // --strict: a plan with lint warnings (a pattern matching nothing, an empty plan) fails
    // In one process on the CPU, run the reference beside the parallel run (ReferenceStream) when
    // the host has the memory for both; off: the reference first, then the parallel run.
    bool reference_beside = true;
    // A model with experts: a parallel run takes the reference's routing for the near-ties it routed
    // otherwise (model/routing_log.h); a plan with float8 casts the reference's value where its own
    // agrees within tolerance (model/float8_log.h). Off (--no-tie-replay): every token routes and
    // every value casts by itself, and a near-tie that goes otherwise fails as any difference does.
    bool replay_ties = true;
    // A bug injected into every parallel run on purpose (verify/faults.h); the CLI parses it from
    // PTOOL_FAULT. Empty: none.
    Fault fault;
};

struct VerifyJob {
    RunInputs inputs;
    // inputs.model_text as read (load_model_text, uninitialised), when the caller parsed it already
    // (`ptool verify` checks it before any rank starts); verify parses it itself otherwise.
    std::shared_ptr<const Model> model;
    std::vector<Plan> plans;
    VerifyOptions options;
    const TensorFile* golden = nullptr;  // compared as recorded too: --golden, golden replay
    // The report's reference keeps every step's tensors (golden replays compare it with the file).
    // Else, in one process, a reference step's tensors go once the last plan reading it compared
    // them (its names and scalars stay), so its record does not grow with --steps.
    bool keep_reference = false;
};

// How a verify's ranks run.
class Launch {
public:
    virtual ~Launch() = default;
    virtual bool rank0() const = 0;  // this process reports (and runs the reference)
    // Every rank is a thread of this process: each reads the reference's record and compares its
    // own pieces in place (RecordOptions::rank_local). Under mpirun rank 0 gathers.
    virtual bool shares_memory() const = 0;
    // Runs fn on every rank of a `ranks`-rank world: threads in this process, or this process's
    // rank of the mpirun job (whose size must be `ranks`; InputError at `where` otherwise).
    // `cores`: in-process, the core slots shared with a reference running beside (null: none).
    virtual void run(int ranks, const SourceLocation& where, const std::function<void(Communicator&)>& fn,
                     std::shared_ptr<CoreSlots> cores) = 0;
    // Waits for rank 0's work outside the collectives (its reference run): no deadline.
    virtual void wait_for_rank0() = 0;
    // The process's exit code: body's on rank 0. Under mpirun a failure on any rank ends the job
    // through MPI_Abort (2 for bad input, 3 otherwise), named; in-process it propagates.
    virtual int exit_code(const std::function<int()>& body) = 0;
};

// Under mpirun/srun: MPI (on GPUs, NCCL bootstrapped over it). Else threads in this process.
std::unique_ptr<Launch> make_launch(Device device, const CommOptions& comm);
std::unique_ptr<Launch> in_process_launch(Device device, const CommOptions& comm);

VerifyReport verify(const VerifyJob& job, Launch& launch);  // the report is rank 0's

// The reference of `plan`: the job's model on one device computing as the plan does (its mixed
// precision: reference_plan), `steps` steps, recorded whole (into opt.publish's record when set;
// `cores`: the slots it shares with the ranks beside it). `reference`: reference_plan(plan) already
// resolved (verify's, which its memory check beside the ranks used too): the run is of that plan
// and rebinds its resolution.
RunRecord record_reference(const RunInputs& in, const Plan& plan, int64_t steps, const RecordOptions& opt,
                           std::shared_ptr<CoreSlots> cores = nullptr,
                           const ResolvedPlan* reference = nullptr);

int64_t steps_for(const Plan& plan, const VerifyOptions& opt, int64_t model_steps);
Tolerance tolerance_for(const Plan& plan, const VerifyOptions& opt, const Model& model);

}  // namespace ptool
