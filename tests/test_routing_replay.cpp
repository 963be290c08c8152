// Routing-aware verdicts (model/routing_log.h): the near-tie bound, and a case built to produce
// near-ties (tests/data/moe_ties: near-duplicate router rows, a rowwise router under tensor
// parallelism) that fails without the replay, passes with it with the near-ties reported, and fails
// at the router with a router bug.
#include <regex>

#include "model/moe_routing.h"
#include "same_runs.h"
#include "test_helpers.h"
#include "verify/faults.h"

using namespace ptool;

namespace test_routing_replay {

TEST_CASE("a near-tie: the chosen set could change with each logit moved within the tolerance", "[cpu]") {
    RouterOptions o;
    o.experts = 4, o.top_k = 2;
    auto tie = [&](std::vector<double> logits, std::vector<double> bias = {}) {
        const Routing r = route(o, logits, bias);
        return near_tie(o, r, 0, logits, bias, 1.3e-6, 1e-5);
    };
    CHECK(tie({1.0, 0.5, 0.5 + 1e-6, -1.0}));        // 2nd and 3rd within 2 x (1e-5 + 1.3e-6 x 0.5)
    CHECK_FALSE(tie({1.0, 0.5, 0.5 - 1e-3, -1.0}));  // apart by more than their tolerances
    CHECK_FALSE(tie({1.0, 1.0 + 1e-7, 0.0, -1.0}));  // the order inside the chosen set does not matter,
    CHECK(tie({1.0, 0.8 + 1e-7, 0.8, -1.0}));        // its boundary with the rest does
    CHECK(tie({0.3, 0.3, 0.3, 0.3}));                // exact ties are near-ties
    // sigmoid with a selection bias (DeepSeek-V3): the keys are sigmoid(l) + bias
    o.score = RouterScore::sigmoid;
    CHECK(tie({0.0, 0.0, 1e-6, 5.0}, {0.0, 0.0, 0.0, -10.0}));
    CHECK_FALSE(tie({0.0, 0.0, 1e-6, 5.0}, {0.0, 0.0, -0.1, -10.0}));
    o.top_k = 4;
    CHECK_FALSE(tie({0.3, 0.3, 0.3, 0.3}));  // every expert chosen: nothing to change
}

namespace {

// tests/data/moe_ties with its router's rows 1 .. 6 near-duplicated in pairs (row 2k+2 = row 2k+1 x
// (1 + 2^-23)); rows 0 and 7 alone. A token whose best expert is 0 or 7 and whose second is one of a
// pair is a near-tie: the pair's other expert scores within rounding of it.
struct TiesCase {
    TensorFile init;
    VerifyJob job;
    TiesCase() {
        job.inputs.model_path = PTOOL_SOURCE_DIR "/tests/data/moe_ties/model.yaml";
        job.inputs.model_text = read_text(job.inputs.model_path);
        const Model m = load_model_text(job.inputs.model_text, job.inputs.model_path);
        for (const auto& [name, p] : m.state_dict()) {
            Tensor t = p->value.clone();
            if (name.size() > 12 && name.compare(name.size() - 12, 12, ".gate.weight") == 0)
                for (int64_t e = 2; e + 1 < t.size(0); e += 2)
                    for (int64_t i = 0; i < t.size(1); ++i)
                        t.set(e * t.size(1) + i,
                              t.item((e - 1) * t.size(1) + i) * (1.0 + std::ldexp(1.0, -23)));
            init.add(name, t);
        }
        if (const char* dump = std::getenv("PTOOL_TIES_INIT")) write_safetensors(dump, init);
        job.inputs.init = &init;
        job.inputs.init_path = "ties.safetensors";
        job.plans = {load_plan(PTOOL_SOURCE_DIR "/tests/data/moe_ties/plan.yaml")};
    }
    VerifyReport run() { return verify(job, *in_process_launch(Device::cpu, CommOptions{})); }
};

// The routing note's numbers: near-ties, tokens, and the near-ties the parallel run took (-1: none said)
std::array<int64_t, 3> routing_note(const PlanReport& p) {
    static const std::regex re(
        R"(routing: (\d+) of the reference's (\d+) token routings[^;]*;(?: the parallel run routed (\d+) of them)?)");
    for (const std::string& n : p.notes) {
        std::smatch m;
        if (std::regex_search(n, m, re))
            return {std::stoll(m[1]), std::stoll(m[2]), m[3].matched ? std::stoll(m[3]) : -1};
    }
    return {-1, -1, -1};
}

}  // namespace

TEST_CASE(
    "a case built for near-ties passes with them replayed, fails without, and a router bug fails at the "
    "router",
    "[cpu]") {
    TiesCase c;
    const VerifyReport replayed = c.run();
    REQUIRE(replayed.plans.size() == 1);
    const auto [ties, tokens, took] = routing_note(replayed.plans[0]);
    INFO(replayed.plans[0].localisation);
    for (const std::string& n : replayed.plans[0].notes) UNSCOPED_INFO(n);
    CHECK(replayed.pass);
    CHECK(tokens == 2 * 2 * 128);  // 2 steps x 2 layers x 8 x 16 tokens
    CHECK(ties > 0);
    CHECK(took > 0);  // the rowwise router's rounding sent some near-ties elsewhere
    CHECK(took <= ties);

    c.job.options.replay_ties = false;  // every token routed by the parallel run's own logits
    const VerifyReport strict = c.run();
    CHECK_FALSE(strict.pass);
    CHECK_THAT(strict.plans[0].localisation, Catch::Contains("routing weights"));

    c.job.options.replay_ties = true;  // a router bug is no near-tie: it fails where the routing is made
    c.job.options.fault = parse_fault("moe_router_unnormalised:layers.0.moe_block.block_sparse_moe");
    const VerifyReport bug = c.run();
    CHECK_FALSE(bug.pass);
    CHECK_THAT(bug.plans[0].localisation,
               Catch::Contains("step 0 forward `layers.0.moe_block.block_sparse_moe` routing weights"));
}

}  // namespace test_routing_replay
