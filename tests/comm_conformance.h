// The communicator conformance suite: every collective x dtypes x uneven sizes x mesh sub-groups,
// against a straightforward serial computation, and point-to-point (comm_conformance_p2p.cpp)
// byte for byte. Run by every communicator's tests (threads in-process, mpi under mpirun,
// cuda_local and nccl on a GPU). The point-to-point failure cases run apart, each in a fresh job.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"

struct ConformanceReport {
    int passed = 0, failed = 0;
    std::vector<std::string> failures;
    void expect(bool ok, const std::string& what);
};

// Collective over world: every rank calls it. device cuda: every tensor is device memory (cuda_local).
void run_comm_conformance(ptool::Communicator& world, ConformanceReport& report,
                          ptool::Device device = ptool::Device::cpu);

// The suite on every rank of an in-process launcher (launch(fn) runs fn on each rank thread, as
// run_rank_threads or run_nccl_threads), the ranks' reports merged; backend: the communicator's name.
struct RanksConformance {
    ConformanceReport report;
    std::string backend;
};
using RankFn = std::function<void(ptool::Communicator&)>;
RanksConformance run_conformance_on_ranks(const std::function<void(const RankFn&)>& launch,
                                          ptool::Device device = ptool::Device::cpu);

// The point-to-point cases (part of run_comm_conformance).
void check_p2p(ptool::Communicator& world, ConformanceReport& report, ptool::Device device);

// A failure case's job: its failure message (in-process: the root cause run_rank_threads
// rethrows; mpi: what the ranks threw, joined) and how long it took.
struct FailureRun {
    std::string message;
    double seconds = 0;
};
struct FailureLauncher {
    // Runs body on every rank of a fresh job (at least 2 ranks) whose communicator times out after `timeout`
    // s.
    std::function<FailureRun(double timeout, const RankFn& body)> run;
    bool shares_abort =
        true;  // ranks share the job's abort flag (threads of one process): a failing rank wakes the others
};
// Point-to-point failures: a recv with no send, a send with no recv, criss-crossed blocking sends,
// dtype and shape mismatches, and (shares_abort) a rank blocked in recv woken by another's failure;
// each message names both ranks and the tag, each case ends within 5 s.
void run_p2p_failure_conformance(const FailureLauncher& launch, ConformanceReport& report,
                                 ptool::Device device = ptool::Device::cpu);
