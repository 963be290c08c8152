// Replaying golden cases: `ptool verify golden/`, `ptool verify MODEL PLAN --golden FILE`.
#pragma once

#include "cli/commands.h"
#include "verify/golden.h"

namespace ptool::cli {

struct GoldenOptions {
    std::string junit, json;
    bool update = false;
    VerifyOptions verify;
};

// One case: its three comparisons and verdict ("PASS", "FAIL", "STALE", "UPDATED").
struct CaseResult {
    std::string path, verdict, detail;
    std::vector<PlanReport> directions;  // parallel vs reference, reference vs golden, parallel vs golden
    double seconds = 0;
};

// Runs (model, plan) against a golden file's recorded init, data and results.
CaseResult replay_case(const GoldenCase& c, const VerifyInputs& base, const Plan& plan, const GoldenOptions& opt,
                       const Common& common);

// `ptool verify GOLDEN...`: every case, one line each, a summary; exit 0 when every case passes.
int verify_golden_files(const std::vector<std::string>& args, const GoldenOptions& opt, const Common& common);

void write_junit(const std::vector<CaseResult>& cases, const std::string& path);

}  // namespace ptool::cli
