// The recorder on a pipeline run: ranks that hold different stages queue different comparisons,
// and rank 0 merges them by key (verify/keyed_gather.h). Two stages recorded rank-locally against
// the one-stage reference report every tensor of both stages, the output and the loss, bitwise
// equal, and meet every module event of the reference by (microbatch, FQN, phase, call) but the
// containers the stages open (the root, `layers`: not called in a stage); one
// element of a stage-1 weight moved before the first step is found there, at the first module
// event that reads it.

#include <set>

#include "comm/comm_threads.h"
#include "pipeline_cases.h"
#include "test_helpers.h"
#include "verify/recorder.h"
#include "verify/report.h"

using namespace ptool;
using namespace ptool::pipeline_test;

namespace test_pipeline_record {

namespace {

RunRecord reference_of(const Case& c, const RunInputs& in, int64_t steps) {
    RunRecord ref;
    run_rank_threads(1, CommOptions{}, [&](Communicator& w) {
        const Plan one = one_device_plan(c);
        Run run(in, one, w);
        ref = record_run(run, steps, RecordOptions{});
    });
    return ref;
}

// The pipeline run recorded against `ref` (rank 0's record); `before` runs on each rank's Run
// before its first step. rank_local off: mpirun's way, here over rank threads (each stage gathers
// its tensors whole, its leader sends them to rank 0, which compares them).
RunRecord pipeline_record(const RunInputs& in, const Plan& plan, const RunRecord& ref, int64_t steps,
                          const std::function<void(Run&)>& before = nullptr, bool rank_local = true) {
    RunRecord out;
    run_rank_threads(2, CommOptions{}, [&](Communicator& w) {
        Run run(in, plan, w);
        if (before) before(run);
        RecordOptions o;
        o.compare_with = &ref;
        o.rank_local = rank_local;
        RunRecord r = record_run(run, steps, o);
        if (w.rank() == 0) out = std::move(r);
    });
    return out;
}

}  // namespace

TEST_CASE(
    "a two-stage run recorded against the one-stage reference: every tensor and module event met by key, "
    "bitwise",
    "[cpu]") {
    for (const auto& [c, rank_local] : [] {
             std::vector<std::pair<Case, bool>> both;  // rank-locally, and gathered to rank 0 (mpirun's)
             for (const Case& c : cases()) both.emplace_back(c, true), both.emplace_back(c, false);
             return both;
         }()) {
        INFO(c.model << " split at " << c.split << ", " << schedule_kind_name(c.schedule)
                     << (rank_local ? ", rank-local" : ", gathered to rank 0"));
        const RunInputs in = inputs(c);
        const RunRecord ref = reference_of(c, in, 2);
        const Plan plan = pipeline_plan(c);
        const RunRecord par = pipeline_record(in, plan, ref, 2, nullptr, rank_local);
        REQUIRE(par.steps.size() == 2);
        CHECK(par.unique_params == ref.unique_params);
        CHECK(par.init_state == ref.init_state);  // both stages' state digests, in state_dict order
        CHECK(par.init_replicas_differ.empty());
        for (size_t k = 0; k < 2; ++k) {
            const StepRecord &r = ref.steps[k], &p = par.steps[k];
            for (const auto& [name, t] : r.tensors) {  // output, loss, grad_norm, every grad, param, buffer
                INFO("step " << k << " " << name);
                auto it = p.vs_reference.find(name);
                REQUIRE(it != p.vs_reference.end());
                CHECK(it->second.pass);
                CHECK(it->second.max_abs == 0);
                CHECK(p.replicas.count(name) == 1);
            }
            CHECK(p.vs_reference.size() == r.tensors.size());
            std::map<std::string, const ModuleEvent*> by_key;
            for (const ModuleEvent& e : p.events) by_key[event_key(e)] = &e;
            std::set<int> microbatches;
            size_t met = 0;
            for (const ModuleEvent& e : r.events) {
                INFO("step " << k << " event " << event_key(e));
                microbatches.insert(e.microbatch);
                auto it = by_key.find(event_key(e));
                if (it ==
                    by_key.end()) {  // only the containers the stages open (train/stage.h) are not called
                    CHECK((e.fqn.empty() || c.split.rfind(e.fqn + ".", 0) == 0));
                    continue;
                }
                ++met;
                REQUIRE(it->second->diff);
                CHECK(it->second->diff->max_abs == 0);
            }
            CHECK(met == by_key.size());  // and the stages report nothing the reference does not
            CHECK(met > r.events.size() / 2);
            CHECK(static_cast<int>(microbatches.size()) == c.microbatches * c.rounds);
        }
        const PlanReport rep = compare_runs(ref, par, plan, Tolerance{});
        CHECK(rep.pass);
        CHECK_FALSE(localise(ref, par, Tolerance{}, rep));
    }
}

TEST_CASE("a wrong element of a stage-1 weight is localised to stage 1's first module event that reads it",
          "[cpu]") {
    for (const bool rank_local : {true, false}) {  // false: gathered to rank 0, as under mpirun
        INFO((rank_local ? "rank-local" : "gathered to rank 0"));
        const Case c{"mlp_stacked", "layers.1", ScheduleKind::one_f_one_b, 4};
        const RunInputs in = inputs(c);
        const RunRecord ref = reference_of(c, in, 1);
        std::string moved;
        const RunRecord par = pipeline_record(
            in, pipeline_plan(c), ref, 1,
            [&](Run& run) {
                if (run.stage() != 1) return;
                const auto params = run.model().named_parameters();
                const auto& [name, p] = params.front();
                moved = name;
                Tensor v = p->value.to(DType::float64);
                v.set(0, v.item(0) * 1.001);
                run.backend().copy(v.to(p->value.dtype()), p->value);
            },
            rank_local);
        REQUIRE_FALSE(moved.empty());
        REQUIRE(moved.rfind("layers.1.", 0) == 0);
        const PlanReport rep = compare_runs(ref, par, pipeline_plan(c), Tolerance{});
        CHECK_FALSE(rep.pass);
        CHECK_FALSE(par.init_state == ref.init_state);
        const auto d = localise(ref, par, Tolerance{}, rep);
        REQUIRE(d);
        CHECK(d->kind == "forward");
        CHECK(d->fqn.rfind("layers.1", 0) == 0);
        // the stage-0 events before it were met and agreed
        CHECK_THAT(d->before, Catch::Contains("layers.0"));
    }
}

}  // namespace test_pipeline_record
