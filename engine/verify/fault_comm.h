// The fault layer's communicators (verify/faults.cpp wraps the mesh's with them): a mesh dim's
// collectives with the ones of one scope broken, as a fault class of verify/faults.h says. Internal
// to verify/faults*.cpp.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/module.h"
#include "verify/faults.h"

namespace ptool::faults {

// pp_stage_sync_skipped: the fault's pipeline stage as this rank holds it (nothing where the rank
// does not hold it): its parameters' FQNs, and the DDP buckets (root -> bucket K) and fully_shard
// units that hold one of them. Under interleaved_1f1b a rank's buckets and units may hold several
// stages' parameters: a bucket of the stage's is skipped whole.
struct StageParams {
    std::set<const Parameter*> held;  // the stage's parameters (their objects: the names come later)
    std::set<std::string> params;
    std::map<std::string, std::vector<bool>> buckets;
    std::set<std::string> units;
};

using FaultBuckets =
    std::map<std::string, std::vector<std::string>>;  // root -> bucket K -> the fault's parameter or ""

// `inner` with the fault's collectives broken; `buckets` and `stage` are the layer's, filled once
// data parallelism is resolved; `pp`, `ep`: the pipeline's or the experts' dim.
std::unique_ptr<Communicator> fault_comm(std::unique_ptr<Communicator> inner, const Fault& fault,
                                         const FaultBuckets& buckets, const StageParams& stage,
                                         bool pp = false, bool ep = false);
// zero_wrong_group: the ZeRO buckets of a fault_comm reduced over `other` (null: its own group).
void set_wrong_group(Communicator& fault_comm, Communicator* other);
// A fault_comm's own communicator.
Communicator& inner_of(Communicator& fault_comm);

}  // namespace ptool::faults
