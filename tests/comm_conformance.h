// The communicator conformance suite: every collective x dtypes x uneven sizes x mesh sub-groups,
// against a straightforward serial computation. Run by every communicator's tests (threads
// in-process, mpi under mpirun, cuda_local on a GPU; later nccl).
#pragma once

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
