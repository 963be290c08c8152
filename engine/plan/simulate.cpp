#include "plan/simulate.h"

#include <map>
#include <set>

#include "core/parallel_for.h"
#include "core/tensor_ops.h"
#include "parallel/device_mesh.h"

#include "comm/comm_simulated.h"

namespace ptool {

RankSimulation simulate_rank(const RunInputs& base, const Plan& plan, int rank, int64_t steps, bool track_phases) {
    RunInputs in = base;
    in.device = Device::meta;
    in.init = nullptr;  // meta parameters hold no values
    in.data = nullptr;  // nor meta batches: a data file's tensors have the model's batch shapes (DataSource checks)
    SimulatedCommunicator world(rank, plan.world_size());
    auto account = std::make_shared<MemoryAccount>();
    MemoryScope scope(account);
    Run run(in, plan, world);
    RankSimulation sim;
    account->reset_peak();
    if (track_phases) account->track_phases();
    sim.memory.rank = rank;
    sim.memory.resident = account->live();
    for (int64_t k = 0; k < std::max<int64_t>(1, steps); ++k) {
        run.counter().reset();
        meta_work() = MetaWork{};
        run.step(k);
    }
    sim.memory.peak = account->peak();
    for (int u = 0; u < kMemoryUses; ++u) sim.memory.at_peak[u] = account->at_peak(static_cast<MemoryUse>(u));
    sim.step_comm = run.counter();
    sim.step_work = meta_work();
    if (track_phases) sim.phase_peaks = account->phase_peaks();
    return sim;
}

std::vector<RankClass> rank_classes(const Model& model, const Plan& plan) {
    std::set<int64_t> dims;
    for (const auto& [name, p] : model.state_dict())
        for (int64_t d : p->value.shape()) dims.insert(d);
    for (int64_t d : model.input.shape) dims.insert(d);
    if (model.target)
        for (int64_t d : model.target->shape) dims.insert(d);
    const int tp = plan.tp_size();
    const int dp = plan.data_parallel ? plan.dim_size(plan.data_parallel->mesh_dim) : 1;
    std::map<std::vector<int64_t>, size_t> index;
    std::vector<RankClass> out;
    for (int r = 0; r < plan.world_size(); ++r) {
        const std::vector<int> coords = DeviceMesh::coords_of(r, plan.mesh);
        int t = 0, d = 0;
        for (size_t i = 0; i < plan.mesh.size(); ++i) {
            if (plan.has_tensor_parallel && plan.mesh[i].name == plan.tp_mesh_dim) t = coords[i];
            if (plan.data_parallel && plan.mesh[i].name == plan.data_parallel->mesh_dim) d = coords[i];
        }
        std::vector<int64_t> key;
        for (int64_t v : dims) {
            const int64_t a = chunk_of(v, tp, t).length;
            key.insert(key.end(), {a, chunk_of(a, dp, d).length, chunk_of(v, dp, d).length});
        }
        auto [it, fresh] = index.emplace(key, out.size());
        if (fresh) out.push_back({});
        out[it->second].ranks.push_back(r);
    }
    return out;
}

std::vector<PredictedRank> predict_ranks(const RunInputs& in, const Model& model, const Plan& plan, int64_t steps,
                                            unsigned threads) {
    const std::vector<RankClass> classes = rank_classes(model, plan);
    std::vector<PredictedRank> out(classes.size());
    parallel_for(classes.size(), threads,
                 [&](size_t i) { out[i] = {simulate_rank(in, plan, classes[i].ranks[0], steps), classes[i].ranks}; });
    return out;
}

}  // namespace ptool
