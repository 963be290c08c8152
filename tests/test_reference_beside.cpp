// The reference recorded beside the parallel run (verify/reference_stream.h): the same numbers as
// recording it first, every diff bitwise; the stream's waits give the core back, and failures on
// either side reach the other.
#include <catch2/catch.hpp>
#include <cstring>
#include <future>
#include <thread>

#include "same_runs.h"
#include "test_helpers.h"
#include "verify/compare.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_reference_beside {

namespace {

VerifyReport run_verify(const std::string& model, const std::string& plan, int64_t steps, bool beside,
                        const char* mesh = nullptr, bool keep_reference = false) {
    VerifyJob job = shipped_job({model.c_str(), plan.c_str(), steps, mesh});
    job.options.reference_beside = beside;
    job.keep_reference = keep_reference;
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    return verify(job, *launch);
}

}  // namespace

TEST_CASE("the reference beside the parallel run gives the numbers of the reference first, bitwise",
          "[cpu]") {
    // TP with partial events (rowwise), attention, sequence parallel, DDP, FSDP + TP with AdamW
    // over steps (resync), more ranks than cores
    using Case = ShippedCase;
    for (const Case& c :
         {Case{"mlp", "mlp_root_module", 2, nullptr}, Case{"gpt_block", "gpt_block_tp", 2, nullptr},
          Case{"seq_mlp", "seq_mlp_sp", 1, nullptr},
          Case{"replicate_net", "replicate_multi_module", 2, nullptr},
          Case{"mlp_stacked_adamw", "mlp_stacked_fsdp_tp", 3, nullptr},
          Case{"mlp", "mlp_root_module", 1, "tp=8"}}) {
        INFO(c.model << " x " << c.plan);
        const VerifyReport first = run_verify(c.model, c.plan, c.steps, false, c.mesh);
        const VerifyReport beside = run_verify(c.model, c.plan, c.steps, true, c.mesh);
        CHECK_FALSE(first.reference_beside);
        CHECK(beside.reference_beside);  // this machine has the cores and memory for it
        CHECK(first.pass);
        CHECK(beside.pass == first.pass);
        REQUIRE(beside.plans.size() == 1);
        check_same_run(first.plans[0].run, beside.plans[0].run, static_cast<size_t>(c.steps));
        // the reference's record: its names in both, its step tensors dropped once compared (scalars kept)
        REQUIRE(first.reference.steps.size() == beside.reference.steps.size());
        for (size_t k = 0; k < first.reference.steps.size(); ++k) {
            const auto &ta = first.reference.steps[k].tensors, &tb = beside.reference.steps[k].tensors;
            REQUIRE(ta.size() == tb.size());
            for (size_t i = 0; i < ta.size(); ++i) {
                CHECK(ta[i].first == tb[i].first);
                CHECK(ta[i].second.defined() == tb[i].second.defined());
                if (ta[i].second.defined()) CHECK(ta[i].second.numel() == 1);
            }
        }
        CHECK(beside.reference.backend == "reference");
    }
}

TEST_CASE("a rank waiting for the reference's step gives its core to the reference", "[cpu]") {
    auto cores = std::make_shared<CoreSlots>(1);  // one core: the waiter holds it until it waits
    ReferenceStream stream(cores);
    StepRecord s0;
    s0.step = 0;
    std::promise<const StepRecord*> got;
    std::thread rank([&] {
        const CoreSlots::Held core(cores.get());
        got.set_value(stream.step(0));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the rank waits, its core given back
    std::thread reference([&] {
        const CoreSlots::Held core(cores.get());  // would never be had if the rank kept it
        stream.publish(&s0);
    });
    auto f = got.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    CHECK(f.get() == &s0);
    rank.join(), reference.join();
    // a step the reference never makes: null once it finished
    stream.finish();
    CHECK(stream.step(1) == nullptr);
    CHECK(stream.step(0) == &s0);  // published steps stay readable
    CHECK_FALSE(stream.failed());
}

TEST_CASE("a failed reference fails its waiting ranks, failed ranks stop the reference", "[cpu]") {
    ReferenceStream failing(nullptr);
    std::thread reference(
        [&] { failing.finish(std::make_exception_ptr(RuntimeError("out of host memory"))); });
    CHECK_THROWS_AS(failing.step(0), RuntimeError);
    reference.join();
    CHECK(failing.failed());
    ReferenceStream cancelled(nullptr);
    CHECK_FALSE(cancelled.cancelled());
    std::thread rank([&] { cancelled.cancel(); });
    CHECK_THROWS_AS(cancelled.step(0), RuntimeError);  // a waiter is woken, not left waiting
    rank.join();
    CHECK(cancelled.cancelled());
    CHECK_FALSE(cancelled.failed());
}

TEST_CASE("the reference's step tensors go once compared, unless the job keeps it whole", "[cpu]") {
    for (bool beside : {false, true}) {
        INFO("beside " << beside);
        const VerifyReport dropped = run_verify("mlp_stacked_adamw", "mlp_stacked_fsdp_tp", 3, beside);
        const VerifyReport kept =
            run_verify("mlp_stacked_adamw", "mlp_stacked_fsdp_tp", 3, beside, nullptr, true);
        CHECK(dropped.pass);
        CHECK(kept.pass);
        REQUIRE(kept.reference.steps.size() == 3);
        REQUIRE(dropped.reference.steps.size() == 3);
        int64_t kept_bytes = 0, dropped_bytes = 0;
        for (size_t k = 0; k < 3; ++k) {
            for (const auto& [name, t] : kept.reference.steps[k].tensors) {
                REQUIRE(t.defined());
                kept_bytes += static_cast<int64_t>(t.nbytes());
            }
            for (const ModuleEvent& e : kept.reference.steps[k].events) CHECK(e.full.defined());
            for (const auto& [name, t] : dropped.reference.steps[k].tensors)
                dropped_bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
            for (const ModuleEvent& e : dropped.reference.steps[k].events) CHECK_FALSE(e.full.defined());
            check_same(kept.plans[0].run.steps[k].vs_reference, dropped.plans[0].run.steps[k].vs_reference);
        }
        CHECK(dropped_bytes <= 3 * 2 * 8);  // the losses (and nothing else) of three steps
        CHECK(kept_bytes > 1000 * dropped_bytes);
    }
}

TEST_CASE(
    "a throttled reference keeps at most two steps ahead of the ranks and lends them its core meanwhile",
    "[cpu]") {
    auto cores = std::make_shared<CoreSlots>(0);  // the ranks' pool has no core of its own here
    ReferenceStream stream(cores, true);
    stream.wait_for_room(0), stream.wait_for_room(1);  // steps 0 and 1: nothing to wait for
    std::promise<void> made;
    std::thread reference([&] {
        stream.wait_for_room(2);  // step 0 still held by the ranks
        made.set_value();
    });
    auto f = made.get_future();
    CHECK(f.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
    {
        const CoreSlots::Held core(cores.get());  // only the reference's lent core can be had
        stream.released(0);
    }
    REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    reference.join();
    // cancelled while waiting: woken, and it stops
    std::thread waiting([&] { CHECK_THROWS_AS(stream.wait_for_room(3 + 1), RuntimeError); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stream.cancel();
    waiting.join();
    ReferenceStream free_running(nullptr, false);  // the job keeps the reference whole: no waits
    free_running.wait_for_room(3);
}

}  // namespace test_reference_beside
