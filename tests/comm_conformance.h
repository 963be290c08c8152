// The communicator conformance suite: every collective x dtypes x uneven sizes x mesh sub-groups,
// against a straightforward serial computation. Run by every communicator's tests (threads
// in-process, mpi under mpirun, cuda_local on a GPU; later nccl).
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
