#include "plan/rejection.h"

#include <stdexcept>

namespace ptool {

const std::vector<RejectionKindInfo>& rejection_kinds() {
    static const std::vector<RejectionKindInfo> kinds = {
        {RejectionKind::memory, "memory", "over the GPU's memory"},
        {RejectionKind::memory_implied, "memory_implied",
         "over the GPU's memory where a variant holding less is (not simulated)"},
        {RejectionKind::slower, "slower", "slower than the plans kept at best (not simulated)"},
        {RejectionKind::refused, "refused", "refused by explain's rules"},
        {RejectionKind::indivisible, "indivisible", "does not divide"},
        {RejectionKind::topology, "topology", "does not map onto the cluster or the model"},
        {RejectionKind::unsampled, "unsampled", "outside what the planner's samples express (not simulated)"},
    };
    return kinds;
}

const RejectionKindInfo& rejection_kind_info(RejectionKind kind) {
    for (const RejectionKindInfo& k : rejection_kinds())
        if (k.kind == kind) return k;
    throw std::logic_error("a rejection kind without a row in rejection_kinds()");
}

std::vector<RejectionGroup> group_rejections(const std::vector<Rejection>& rejected) {
    std::vector<RejectionGroup> groups;
    for (const RejectionKindInfo& k : rejection_kinds()) {
        RejectionGroup g{&k};
        for (const Rejection& r : rejected)
            if (r.kind == k.kind) g.first = g.first ? g.first : &r, ++g.count;
        if (g.count) groups.push_back(g);
    }
    return groups;
}

}  // namespace ptool
