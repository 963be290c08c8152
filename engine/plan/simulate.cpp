#include "plan/simulate.h"

#include <set>

#include "comm/comm_simulated.h"

namespace ptool {

RankSimulation simulate_rank(const RunInputs& base, const Plan& plan, int rank, int64_t steps) {
    RunInputs in = base;
    in.device = Device::meta;
    in.init = nullptr;  // meta parameters hold no values
    SimulatedCommunicator world(rank, plan.world_size());
    auto account = std::make_shared<MemoryAccount>();
    MemoryScope scope(account);
    Run run(in, plan, world);
    RankSimulation sim;
    account->reset_peak();
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
    return sim;
}

std::vector<RankMemory> predict_memory(const RunInputs& in, const Plan& plan, int64_t steps) {
    std::vector<RankMemory> out;
    for (int r : distinct_ranks(plan)) out.push_back(simulate_rank(in, plan, r, steps).memory);
    return out;
}

std::vector<int> distinct_ranks(const Plan& plan) {
    const int tp = plan.tp_size();
    const int dp = plan.data_parallel ? plan.dim_size(plan.data_parallel->mesh_dim) : 1;
    std::set<int> out;
    for (int d : {0, dp - 1})
        for (int t = 0; t < tp; ++t) {
            std::vector<int> coords(plan.mesh.size(), 0);
            for (size_t i = 0; i < plan.mesh.size(); ++i) {
                if (plan.has_tensor_parallel && plan.mesh[i].name == plan.tp_mesh_dim) coords[i] = t;
                if (plan.data_parallel && plan.mesh[i].name == plan.data_parallel->mesh_dim) coords[i] = d;
            }
            int r = 0;
            for (size_t i = 0; i < plan.mesh.size(); ++i) r = r * plan.mesh[i].size + coords[i];
            out.insert(r);
        }
    return {out.begin(), out.end()};
}

}  // namespace ptool
