// `ptool verify` as the command line names it (verify_command.cpp): above golden replay, which runs
// verify.h's core; verify.h knows nothing of golden files or this command.
#pragma once

#include <functional>

#include "verify/golden_replay.h"
#include "verify/verify.h"

namespace ptool {

// `ptool verify` as the command line names it: MODEL PLAN... (with --golden FILE, three ways), or
// golden files and folders to replay.
struct VerifyCommand {
    std::string model;               // a model YAML, or a golden file / folder
    std::vector<std::string> plans;  // plan YAMLs, or more golden files / folders
    std::string init, data, golden;
    std::vector<std::string> mesh;  // --mesh NAME=SIZE, each applied to every plan
    std::string dtype;
    Device device = Device::cpu;
    bool update = false;  // golden replay: re-record cases whose numbers moved
    VerifyOptions options;
};

// Runs a verify command in this process or as this process's rank of an mpirun job, with the same
// checks and exit codes either way: every file is read and checked before any rank starts (2), a
// failed rank is 3, a mismatch 1. Rank 0's results go to the callbacks as they are ready: each
// golden case's, or the report (with the --golden case's three comparisons, if any).
int run_verify_command(const VerifyCommand& cmd, const std::function<void(const VerifyReport&)>& on_report,
                       const std::function<void(const CaseResult&)>& on_case);

}  // namespace ptool
