// PTOOL_FAULT=KIND:FQN, the bug verify injects into its parallel runs on purpose (verify/faults.h),
// read from the environment here and nowhere else: `verify` and `plan --verify` hand it to the
// engine in VerifyOptions::fault. A bad value is exit 2 naming the kinds, before anything runs.
#include <cstdlib>

#include "cli/commands.h"
#include "verify/faults.h"

namespace ptool::cli {

Fault fault_from_environment() {
    return parse_fault(std::getenv("PTOOL_FAULT"));
}

}  // namespace ptool::cli
