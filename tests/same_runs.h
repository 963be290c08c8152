// Two verifies of a shipped case whose records must agree bitwise: every diff's numbers, replica
// states, module events and construction digests (the reference beside vs first, rank-local vs
// gathered comparison).
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <string>

#include "test_helpers.h"
#include "verify/run_record.h"
#include "verify/verify.h"

// A shipped model and plan (models/, plans/), the steps and a --mesh override (null: the plan's)
struct ShippedCase {
    const char* model;
    const char* plan;
    int64_t steps;
    const char* mesh;
};

inline ptool::VerifyJob shipped_job(const ShippedCase& c) {
    ptool::VerifyJob job;
    job.inputs.model_path = PTOOL_SOURCE_DIR "/models/" + std::string(c.model) + ".yaml";
    job.inputs.model_text = read_text(job.inputs.model_path);
    ptool::Plan p = ptool::load_plan(PTOOL_SOURCE_DIR "/plans/" + std::string(c.plan) + ".yaml");
    if (c.mesh) ptool::apply_mesh_flags(p, {c.mesh});
    job.plans = {p};
    job.options.steps = c.steps;
    return job;
}

inline bool same_bits(double a, double b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

inline void check_same(const ptool::TensorDiff& a, const ptool::TensorDiff& b) {
    CHECK(a.shape_ok == b.shape_ok);
    CHECK(a.nonfinite == b.nonfinite);
    CHECK(same_bits(a.max_abs, b.max_abs));
    CHECK(same_bits(a.max_rel, b.max_rel));
    CHECK(same_bits(a.headroom, b.headroom));
    CHECK(same_bits(a.rel_fro, b.rel_fro));
    CHECK(same_bits(a.err_norm, b.err_norm));
    CHECK(same_bits(a.ref_norm, b.ref_norm));
    CHECK(a.max_ulp == b.max_ulp);
    CHECK(a.pass == b.pass);
}

inline void check_same(const std::map<std::string, ptool::TensorDiff>& a,
                       const std::map<std::string, ptool::TensorDiff>& b) {
    REQUIRE(a.size() == b.size());
    for (const auto& [name, d] : a) {
        INFO(name);
        REQUIRE(b.count(name));
        check_same(d, b.at(name));
    }
}

// The parallel run's records: every step's diffs against the reference and the shadow optimizer,
// replica states and module events, and the construction's digests
inline void check_same_run(const ptool::RunRecord& a, const ptool::RunRecord& b, size_t steps) {
    REQUIRE(a.steps.size() == steps);
    REQUIRE(b.steps.size() == a.steps.size());
    for (size_t k = 0; k < a.steps.size(); ++k) {
        CHECK_FALSE(a.steps[k].vs_reference.empty());
        check_same(a.steps[k].vs_reference, b.steps[k].vs_reference);
        check_same(a.steps[k].vs_shadow, b.steps[k].vs_shadow);
        CHECK(a.steps[k].replicas == b.steps[k].replicas);
        REQUIRE(a.steps[k].events.size() == b.steps[k].events.size());
        CHECK_FALSE(a.steps[k].events.empty());
        for (size_t i = 0; i < a.steps[k].events.size(); ++i) {
            const ptool::ModuleEvent &x = a.steps[k].events[i], &y = b.steps[k].events[i];
            INFO(x.fqn);
            CHECK(x.fqn == y.fqn);
            CHECK(x.phase == y.phase);
            REQUIRE(x.diff.has_value() == y.diff.has_value());
            if (x.diff) check_same(*x.diff, *y.diff);
        }
    }
    CHECK(a.init_state == b.init_state);
    CHECK(a.init_replicas_differ == b.init_replicas_differ);
}
