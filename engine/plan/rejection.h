// A candidate the plan search rejected: its shape, why, and the kind of why (the text output groups
// by kind: a count and an example each, every one under -v; --json lists them all with the kind).
#pragma once

#include <string>
#include <vector>

namespace ptool {

enum class RejectionKind {
    topology,        // the mesh does not map onto the cluster (tp across a node) or the model (no tp plan)
    indivisible,     // the batch, sequence, blocks or experts do not split over the dims or microbatches
    refused,         // explain's rules refuse the plan (uneven shards, a conflict, a changed computation)
    memory,          // simulated and over the GPU's memory
    memory_implied,  // not simulated: a variant that holds less was over the GPU's memory
    slower,          // not simulated: at least as slow as the fastest plans already kept
    unsampled,       // not simulated: outside what the planner's samples express (a V past 4 pp ranks)
};

struct RejectionKindInfo {
    RejectionKind kind;
    const char* name;   // --json's
    const char* title;  // the text output's group
};
// One row per kind, in the order the text output lists the groups.
const std::vector<RejectionKindInfo>& rejection_kinds();
const RejectionKindInfo& rejection_kind_info(RejectionKind kind);

struct Rejection {
    std::string shape;   // "tp=16", "dp=8 x tp=8 replicate"
    std::string reason;  // "crosses a node of 8 GPUs", "needs 93.1 GiB > 75.6 GiB (...)"
    RejectionKind kind = RejectionKind::refused;
};

// The rejections grouped by kind, in rejection_kinds()'s order: each kind's count and first.
struct RejectionGroup {
    const RejectionKindInfo* kind;
    int count = 0;
    const Rejection* first = nullptr;
};
std::vector<RejectionGroup> group_rejections(const std::vector<Rejection>& rejected);

}  // namespace ptool
