// A pipeline's step time (plan/pipeline_time.h; plan/pipeline_search.h's time_schedule plays a
// schedule with per-stage costs): the schedule's critical path, held to the closed forms at
// uniform stages (GPipe and 1F1B: (m + p - 1)(t_f + t_b), a bubble of (p - 1)/m; interleaved
// (p - 1)/(v m)), transfers on the path, a slow stage, and a list that cannot finish refused.
#include "plan/pipeline_search.h"
#include "test_helpers.h"

using namespace ptool;

namespace {

// The costs of `s` with every stage's forward taking f and backward b, each transfer c, the
// step's tail free: time_schedule plays `s` with them.
PipelineSample uniform(const Schedule& s, double f, double b, double c) {
    PipelineSample out;
    out.forward.assign(static_cast<size_t>(s.stages), f),
        out.backward.assign(static_cast<size_t>(s.stages), b);
    out.tail.assign(s.ranks.size(), 0.0);
    out.transfer = c;
    return out;
}

PipelineTiming timed(const Schedule& s, double f, double b, double c) {
    return time_schedule(s, uniform(s, f, b, c));
}

}  // namespace

TEST_CASE("pipeline time: GPipe and 1F1B at uniform stages are the closed form", "[cpu][pipeline_time]") {
    for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b})
        for (int p : {2, 3, 4, 8})
            for (int m : {p, 2 * p, 3 * p + 1}) {
                const PipelineTiming t = timed(pipeline_schedule(kind, p, m), 1.0, 2.0, 0.0);
                INFO(schedule_kind_name(kind) << " p " << p << " m " << m);
                CHECK(t.pipelined == Approx((m + p - 1) * 3.0));
                CHECK(t.bubble == Approx(static_cast<double>(p - 1) / m));
                for (double busy : t.busy) CHECK(busy == Approx(3.0 * m));
            }
}

TEST_CASE("pipeline time: rounds of gradient accumulation each fill and drain", "[cpu][pipeline_time]") {
    const int p = 4, m = 4, rounds = 3;
    const PipelineTiming t = timed(pipeline_schedule(ScheduleKind::one_f_one_b, p, m, rounds), 1.0, 2.0, 0.0);
    CHECK(t.pipelined == Approx(rounds * (m + p - 1) * 3.0));
}

TEST_CASE("pipeline time: transfers are on the critical path", "[cpu][pipeline_time]") {
    for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
        const int p = 4, m = 8;
        const double c = 0.25;
        const PipelineTiming free = timed(pipeline_schedule(kind, p, m), 1.0, 2.0, 0.0);
        const PipelineTiming paid = timed(pipeline_schedule(kind, p, m), 1.0, 2.0, c);
        INFO(schedule_kind_name(kind));
        // the first forward crosses p - 1 links to reach the last stage, its gradient p - 1 back
        CHECK(paid.pipelined >= free.pipelined + 2 * (p - 1) * c - 1e-12);
        CHECK(paid.bubble > free.bubble);
    }
}

TEST_CASE("pipeline time: a stage twice as slow sets the pace", "[cpu][pipeline_time]") {
    const int p = 2, m = 8;
    const Schedule s = pipeline_schedule(ScheduleKind::one_f_one_b, p, m);
    PipelineSample costs = uniform(s, 1.0, 2.0, 0.0);
    costs.forward[1] *= 2, costs.backward[1] *= 2;
    const PipelineTiming t = time_schedule(s, costs);
    // the slow stage works 6m, and waits at least for the fast stage's first forward
    CHECK(t.pipelined >= 6.0 * m + 1.0);
    CHECK(t.busy[0] == Approx(3.0 * m));
    CHECK(t.busy[1] == Approx(6.0 * m));
}

TEST_CASE("pipeline time: lists that cannot finish are refused, naming the rank", "[cpu][pipeline_time]") {
    // both ranks receive before they send: rank 0 waits for microbatch 0's gradient it never got to
    std::vector<std::vector<TimedActions>> lists(2);
    lists[0] = {{{{ActionKind::recv_backward, 0, 0}}, {0.0}},
                {{{ActionKind::forward, 0, 0}}, {1.0}},
                {{{ActionKind::send_forward, 0, 0}}, {0.0}}};
    lists[1] = {{{{ActionKind::recv_forward, 1, 0}}, {0.0}},
                {{{ActionKind::forward, 1, 0}}, {1.0}},
                {{{ActionKind::backward, 1, 0}}, {2.0}},
                {{{ActionKind::send_backward, 1, 0}}, {0.0}}};
    CHECK_THROWS_WITH(pipeline_critical_path(lists), Catch::Contains("pipeline rank 0 waits"));
}

TEST_CASE("pipeline time: interleaved 1F1B at uniform stages", "[cpu][pipeline_time]") {
    for (int p : {2, 4})
        for (int v : {2, 4})
            for (int m : {p, 2 * p, 4 * p}) {
                // a rank's work per microbatch is 1 + 2 split over its v stages
                const Schedule s = pipeline_schedule(ScheduleKind::interleaved_one_f_one_b, p * v, m, 1, v);
                const PipelineTiming t = timed(s, 1.0 / v, 2.0 / v, 0.0);
                const PipelineTiming one =
                    timed(pipeline_schedule(ScheduleKind::one_f_one_b, p, m), 1.0, 2.0, 0.0);
                INFO("p " << p << " v " << v << " m " << m << ": bubble " << t.bubble);
                for (double busy : t.busy) CHECK(busy == Approx(3.0 * m));
                CHECK(t.bubble == Approx(static_cast<double>(p - 1) / (v * m)));
                CHECK(t.bubble < one.bubble);
            }
}
