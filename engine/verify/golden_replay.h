// Replaying golden cases: `ptool verify golden/` (the CI form) and the three-way
// `ptool verify MODEL PLAN --golden FILE`. A case runs the reference and the plan from the
// golden's recorded initial state and data and compares three ways: parallel vs reference,
// reference vs golden, parallel vs golden.
#pragma once

#include "verify/golden.h"

namespace ptool {

struct CaseResult {
    std::string path;
    Verdict verdict = Verdict::pass;
    std::string detail;                  // why it failed (the worst tensors, the divergence) or is stale
    std::vector<std::string> causes;     // a failure's expected causes ("cause: ..."), as verify prints them
    std::vector<PlanReport> directions;  // parallel vs reference, reference vs golden, parallel vs golden
    int world_size = 1;
    double seconds = 0;
    DType dtype = DType::float32;  // the model's, as run
    double reference_seconds = 0;
};

struct ReplayOptions {
    bool update = false;  // re-record a case whose numbers moved (model and plan unchanged), loudly
    VerifyOptions verify;
};

// One case with this model and plan (the golden's own, or the user's for --golden) on `launch`.
CaseResult replay_case(const GoldenCase& c, const RunInputs& base, const Plan& plan, const ReplayOptions& opt,
                       Launch& launch);

// Every case of the files and folders in `args`, in this process; on_case sees each as it ends.
std::vector<CaseResult> replay_golden_files(const std::vector<std::string>& args, const ReplayOptions& opt,
                                            Device device, const std::string& dtype,
                                            const std::function<void(const CaseResult&)>& on_case);

}  // namespace ptool
