// Replica checks for the Recorder (verify/recorder_state.h): whether the copies of a replicated
// tensor agree bitwise on every dim it is replicated on, and the state recorded for it.
#include "verify/digest.h"
#include "verify/recorder_state.h"

namespace ptool::recording {

// Whether a tensor's replicas agree bitwise, over the data dims and over the others: every
// group of replicas on each dim it is replicated on, not only rank 0's (on a 2 x 2 HSDP mesh
// ranks 1 and 3 are a dp_replicate group rank 0 is not in). One all_gather of every stage
// rank's digest; each rank then checks each rank's copy against its group's coordinate-0 copy,
// so every rank knows the same verdict (collective over the stage, whatever the result).
Recorder::Agreement Recorder::agreement(const Tensor& local, const Placements& pl) {
    Agreement a;
    std::vector<int> dims;  // the replicated dims
    for (int d : order_)
        if (pl.on(d).is_replicate() && run_.comm(d).size() > 1) dims.push_back(d);
    if (dims.empty()) return a;
    a.replicas = true;
    Communicator& stage = run_.stage_comm();
    Tensor mine({1}, DType::int64), all({stage.size()}, DType::int64);
    mine.data<int64_t>()[0] = static_cast<int64_t>(tensor_digest(on_host(local)));
    stage.all_gather(mine, all);
    for (int d : dims) {
        const std::vector<int>& first = group_first_.at(d);
        bool ok = true;
        for (int r = 0; r < stage.size() && ok; ++r)
            ok = all.data<int64_t>()[r] == all.data<int64_t>()[first[r]];
        (run_.dims().is_data_dim(d) ? a.data : a.model) &= ok;
    }
    return a;
}

// Per mesh dim but pp: each stage rank's group's coordinate-0 rank on that dim (agreement's
// reference copy), computed once.
std::map<int, std::vector<int>> Recorder::group_firsts(const Run& run) {
    std::map<int, std::vector<int>> out;
    const std::vector<MeshDim>& sd = run.stage_dims();
    const int pp = run.dims().index(DimRole::pp), n = run.stage_comm().size();
    for (int d = 0; d < run.dims().ndim(); ++d) {
        if (d == pp) continue;
        const int at = pp >= 0 && d > pp ? d - 1 : d;  // its position among the stage's dims
        std::vector<int>& first = out[d];
        for (int r = 0; r < n; ++r) {
            std::vector<int> c = DeviceMesh::coords_of(r, sd);
            c[at] = 0;
            first.push_back(DeviceMesh::rank_of(c, sd));
        }
    }
    return out;
}

ReplicaState Recorder::replica_state(const Tensor& local, const Placements& pl, bool ignored) {
    const Agreement a = agreement(local, pl);
    ReplicaState state = a.replicas ? ReplicaState::equal : ReplicaState::sharded;
    if (ignored && data_.size() > 1) state = a.data ? ReplicaState::synced : ReplicaState::ignored;
    if (!a.model || (!a.data && !ignored)) state = ReplicaState::differ;
    return state;
}

// Before clip_grad_norm scales them, whether each gradient's copies agree (collective over the
// stage, as replica_state): a copy out of step changes the norm its group clips by, so after the
// clip every gradient of that group differs, each by the norms' ratio, and only this check still
// names the one that did first (localise: verify/report.cpp). Noted, where they differ, as
// step{k}.grad_before_clip.{name} (no tensor of that name is recorded). ZeRO-2's gradients are
// its shards until the step's recording gathers them: not checked here.
void Recorder::before_clip(StepRecord& sr) {
    if (!opt_.tensors) return;
    Unaccounted pause(&run_.counter());
    const ZeroOptimizer* z = run_.zero();
    for (const auto& [name, p] : run_.model().named_parameters()) {
        if (!p->grad.defined() || run_.shared_copy(p.get()) || (z && z->stage() == 2 && z->manages(p.get())))
            continue;
        if (replica_state(p->grad, run_.placements(p.get()), run_.ignored(name)) == ReplicaState::differ)
            note_state(sr, fmt::format("step{}.{}{}", sr.step, kGradBeforeClip, name), ReplicaState::differ);
    }
}

}  // namespace ptool::recording
