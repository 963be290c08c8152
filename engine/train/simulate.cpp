#include "train/simulate.h"

#include <map>
#include <set>

#include "comm/comm_simulated.h"
#include "core/host_memory.h"
#include "core/parallel_for.h"
#include "core/tensor_ops.h"
#include "model/context_shard.h"
#include "model/float8_cost.h"
#include "parallel/device_mesh.h"

namespace ptool {

RankSimulation simulate_rank(const RunInputs& base, const Plan& plan, int rank, int64_t steps,
                             bool track_phases, size_t allocator_capacity, const ResolvedPlan* resolved,
                             bool replay_last) {
    RunInputs in = base;
    in.device = Device::meta;
    in.init = nullptr;  // meta parameters hold no values
    in.data =
        nullptr;  // nor meta batches: a data file's tensors have the model's batch shapes (DataSource checks)
    SimulatedCommunicator world(rank, plan.world_size());
    auto account = std::make_shared<MemoryAccount>();
    account->set_single_thread();  // the simulation runs on this thread alone
    account->model_allocator(allocator_capacity);
    MemoryScope scope(account);
    Run run(in, plan, world, nullptr, resolved);
    RankSimulation sim;
    account->reset_peak();
    if (track_phases) account->track_phases();
    sim.memory.rank = rank;
    sim.memory.resident = account->live();
    MetaWork work_before;
    CommByOpDim comm_before;
    // only the last step's actions are kept, which is one of the last two (the one before the last
    // where the last is replayed): the steps before them are not observed (their actions were
    // measured and cleared)
    bool observed = false;
    if (plan.pipeline)  // a pipeline's step is its actions' critical path; no other plan reads them
        run.set_action_observer([&](const std::vector<Action>& actions, bool done) {
            if (!observed) return;
            if (!done) {
                work_before = meta_work(), comm_before = by_op_dim(run.counter());
                return;
            }
            sim.actions.push_back({actions, work_since(work_before, meta_work()),
                                   comm_since(comm_before, by_op_dim(run.counter()))});
        });
    const Float8Compiled compiled(plan.compile);  // what explain prices of torch.compile
    for (int64_t k = 0; k < std::max<int64_t>(1, steps); ++k) {
        // the last step from the third on is the one before it again (the optimizer's state exists
        // from the second): its allocations replayed, not simulated, where they hand their
        // objects on as a steady state does (AllocatorModel::replay_step)
        const bool replayed_next = replay_last && steps >= 3 && k == steps - 2;
        if (replayed_next) account->record_allocator_step();
        run.counter().reset();
        meta_work() = MetaWork{};
        sim.actions.clear();  // the last step's
        observed = k + 2 >= std::max<int64_t>(1, steps);
        run.step(k);
        if (k == 0)
            sim.memory.first_step_peak = account->peak(),
            sim.memory.torch_first_step_peak = account->torch_peak();
        if (replayed_next && account->replay_allocator_step()) {
            sim.last_step_replayed = true;
            break;
        }
    }
    sim.memory.peak = account->peak();
    sim.memory.reserved_peak = account->peak_reserved();
    sim.memory.over_capacity = account->over_capacity();
    for (int u = 0; u < kMemoryUses; ++u) sim.memory.at_peak[u] = account->at_peak(static_cast<MemoryUse>(u));
    sim.memory.torch_peak = account->torch_peak();
    for (int u = 0; u < kMemoryUses; ++u)
        sim.memory.torch_at_peak[u] = account->torch_at_peak(static_cast<MemoryUse>(u));
    sim.memory.reserved_by_stream = account->torch_reserved_by_stream_at_peak();
    sim.step_comm = run.counter();
    sim.step_work = meta_work();
    if (track_phases) sim.phase_peaks = account->phase_peaks();
    return sim;
}

void require_host_memory(const RunInputs& in, const Plan& plan, int64_t steps, const ResolvedPlan* resolved) {
    if (in.device != Device::cpu) return;
    const int64_t memory = available_host_memory(), space = address_space_left();
    // the memory the host has, or the address space the limit leaves (`ulimit -v`) where less
    const int64_t available = space >= 0 && (memory <= 0 || space < memory) ? space : memory;
    if (available <= 0 && space != 0) return;
    int64_t need = 0;
    try {
        const RankSimulation sim =
            simulate_rank(in, plan, 0, std::min<int64_t>(steps, kSteadyStateSteps), false, 0, resolved);
        need = std::max(sim.memory.peak, sim.memory.resident);
    } catch (const RuntimeError&) {  // a tensor beyond any device's memory (the caching allocator's)
        throw;
    } catch (const std::exception&) {  // (an input the run itself refuses, with its own message)
        return;
    }
    if (need > available)
        throw RuntimeError(fmt::format(
            "the run needs about {:.2f} GiB of host memory (its peak, predicted on meta tensors), and "
            "{:.2f} GiB is available ({}): out of memory before it starts",
            static_cast<double>(need) / (1 << 30), static_cast<double>(available) / (1 << 30),
            available == space ? "the address space left under this process's limit, ulimit -v"
                               : "MemAvailable"));
}

void check_run(const RunInputs& base, const Plan& plan, int rank) {
    RunInputs in = base;
    in.device = Device::meta, in.init = nullptr, in.data = nullptr;
    SimulatedCommunicator world(rank, plan.world_size());
    MemoryScope scope(std::make_shared<MemoryAccount>());
    Run run(in, plan, world);
}

std::vector<RankClass> rank_classes(const Model& model, const Plan& plan) {
    std::set<int64_t> dims;
    for (const auto& [name, p] : model.state_dict())
        for (int64_t d : p->value.shape()) dims.insert(d);
    for (int64_t d : model.input.shape) dims.insert(d);
    if (model.target)
        for (int64_t d : model.target->shape) dims.insert(d);
    std::set<int64_t> rows;  // the parameters' rows, which fully_shard cuts
    for (const auto& [name, p] : model.named_parameters())
        if (!p->value.shape().empty()) rows.insert(p->value.shape()[0]);
    // tp: the tp dim; shard: the dim fully_shard cuts the tp piece's rows over; batch: the data
    // dims flattened, over which the batch's rows split
    const ParallelDims& pd = plan.dims;
    const int shard_dim =
        pd.has(DimRole::dp_shard) ? pd.index(DimRole::dp_shard) : pd.index(DimRole::dp_replicate);
    const int tp = pd.size(DimRole::tp), shard = shard_dim >= 0 ? plan.mesh()[shard_dim].size : 1,
              batch = pd.data_size();
    const int cp = plan.context_parallel ? pd.size(DimRole::cp) : 1;
    const int64_t pieces =
        plan.context_parallel ? ContextShard::pieces(cp, plan.context_parallel->load_balance) : 1;
    std::map<std::vector<int64_t>, size_t> index;
    std::vector<RankClass> out;
    for (int r = 0; r < plan.world_size(); ++r) {
        const std::vector<int> coords = DeviceMesh::coords_of(r, plan.mesh());
        const int t = pd.has(DimRole::tp) ? coords[pd.index(DimRole::tp)] : 0,
                  s = shard_dim >= 0 ? coords[shard_dim] : 0;
        int b = 0;
        for (int d : pd.data_dims()) b = b * plan.mesh()[d].size + coords[d];
        // fully_shard over dp_shard x cp: the flattened group's coordinate (the shard dim's major)
        const int c = pd.cp_shards_params() ? coords[pd.index(DimRole::cp)] : 0,
                  cps = pd.cp_shards_params() ? pd.size(DimRole::cp) : 1;
        // a pipeline rank holds its own stages' layers: every pp coordinate is its own class
        std::vector<int64_t> key{pd.has(DimRole::pp) ? coords[pd.index(DimRole::pp)] : 0};
        for (int64_t v : dims) {
            const int64_t a = chunk_of(v, tp, t).length;
            key.insert(key.end(), {a, chunk_of(a, shard, s).length, chunk_of(v, batch, b).length,
                                   // a dim tp does not cut, fully_shard-ed over the shard dim alone
                                   // (HSDP x TP: a rowwise bias's rows, 5 over dp_shard 3 as 2, 2, 1)
                                   chunk_of(v, shard, s).length,
                                   // a cp rank's positions cut again over tp by sequence parallelism
                                   // (6 over tp 4 as 2, 2, 2, 0)
                                   cp > 1 && v % pieces == 0 ? chunk_of(v / cp, tp, t).length : 0});
        }
        // fully_shard over dp_shard x cp: a parameter's rows (its tp piece's, or whole where tp does
        // not cut them) over the two flattened (97 over 2 x 2 as 25, 25, 25, 22)
        if (pd.cp_shards_params())
            for (int64_t v : rows) {
                const int64_t a = chunk_of(v, tp, t).length;
                key.insert(key.end(), {chunk_of(a, shard * cps, s * cps + c).length,
                                       chunk_of(v, shard * cps, s * cps + c).length});
            }
        auto [it, fresh] = index.emplace(key, out.size());
        if (fresh) out.push_back({});
        out[it->second].ranks.push_back(r);
    }
    return out;
}

std::vector<PredictedRank> predict_ranks(const RunInputs& in, const Model& model, const Plan& plan,
                                         int64_t steps, unsigned threads, size_t allocator_capacity,
                                         const Resolution* resolution) {
    const std::vector<RankClass> classes = rank_classes(model, plan);
    std::vector<PredictedRank> out(classes.size());
    const ResolvedPlan resolved{&plan, &model, resolution};
    parallel_for(classes.size(), threads, [&](size_t i) {
        out[i] = {simulate_rank(in, plan, classes[i].ranks[0], steps, false, allocator_capacity,
                                resolution ? &resolved : nullptr),
                  classes[i].ranks};
    });
    return out;
}

}  // namespace ptool
