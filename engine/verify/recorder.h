// Recording a run: what a Run leaves to compare, on rank 0 of its world. After construction, the
// state's digests and whether the replicas agree; per step, the output, loss, every gradient,
// parameter and buffer gathered to full size under its golden name, whether the ranks' copies of
// each replicated tensor are bitwise equal (by digest, per mesh dim), and every module's output
// and input gradient (localisation's events). The gathers run with the counter paused: they are
// verification's, not the plan's. With compare_with / golden, each tensor is compared as it is
// recorded and the diff kept, not the tensor: rank-locally (RecordOptions::rank_local: no rank
// holds another's piece) or, under mpirun, by rank 0 on one gathered tensor at a time (a pipeline's:
// each stage gathers its own, and its leader sends them whole to rank 0 at the step's end).
#pragma once

#include "train/run.h"
#include "verify/reference_stream.h"
#include "verify/run_record.h"

namespace ptool {

struct RecordOptions {
    bool events = true;         // module outputs and input gradients (localisation)
    bool init_tensors = false;  // keep init.param.* / init.buffer.* (golden files)
    // Record the state's digests, the output, gradients, parameters and buffers. Off (`ptool run`
    // without --dump, which prints the loss and time only): each step's loss (and grad_norm) alone,
    // nothing gathered, hashed or copied off the device.
    bool tensors = true;
    const RunRecord* compare_with = nullptr;  // the reference's record
    const TensorFile* golden = nullptr;       // a golden file (--golden, replay)
    Tolerance tol;                            // for compare_with and golden
    // Also step the model's optimizer (AdamW) on full copies with the run's own gradients, and
    // record how each parameter compares with that (StepRecord::vs_shadow): every rank, one value.
    bool shadow_optimizer = false;
    // After each step whose parameters left tolerance, continue from the truth's: the golden's if
    // any, else compare_with's (Recorder::resync). Every rank passes the same value.
    bool resync = false;
    // Every rank reads compare_with and golden (rank threads of one process) and compares its own
    // pieces of the parameters, gradients and activations with the matching boxes of the truth's
    // tensors in place; only the metrics are gathered (verify/compare.h: exact sums, so the numbers
    // are what comparing whole tensors gives). Off: rank 0 gathers each tensor (mpirun).
    bool rank_local = false;
    // record_reference: the reference logs each moe call's routing and near-ties and each float8
    // linear's operands into them (verify/reference_logs.h), which the parallel runs then follow.
    ReferenceLogs logs;
    // Called after each step on rank 0 with the step's number, loss and seconds (`ptool run`'s lines).
    std::function<void(int64_t, double, double)> on_step;
    // A reference recorded beside its parallel run (verify, rank threads of one process). The
    // reference (one rank) records into publish->record and publishes each step as it completes;
    // it stops early when the stream is cancelled.
    ReferenceStream* publish = nullptr;
    // compare_with (== &follow->record) is that reference: its steps are read through follow, each
    // once published. The step's module events are kept (this rank's pieces) and compared at the
    // step's end, so no rank waits for the reference inside a step, where the others would wait
    // for it in a collective.
    ReferenceStream* follow = nullptr;
    // Called on rank 0 once every rank is done with compare_with's step k (its comparisons and
    // resync, ranks of one process): verify drops that step's tensors where nothing reads them
    // later, so the reference's record does not grow with the steps. Every rank passes the same.
    std::function<void(int64_t)> done_with_reference_step;
};

// Steps `run` `steps` times and records it. Every rank of the run's world calls it; the record is
// rank 0's (the others return an empty one).
RunRecord record_run(Run& run, int64_t steps, const RecordOptions& opt);

// The world's step from each rank's start and length on one clock (ranks of one process): the
// first rank's start to the last rank's end (collective). Rank threads that take turns on the
// cores start their steps at different times; rank 0's own interval would miss what ran before it.
double world_step_seconds(Communicator& world, double started, double seconds);

}  // namespace ptool
