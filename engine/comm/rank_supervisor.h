// Rank supervision under mpirun/srun: a rank killed by a signal still ends the job with exit 3.
//
// A launcher reports a rank that dies by a signal with the signal's status (mpirun exits 137
// for SIGKILL) and no word of what the rank was doing. So, as torchrun's agent does for its
// workers, each ptool process started by a launcher forks once, before MPI_Init: the child is
// the rank and does all the work; the parent only waits for it. When the child is killed by a
// signal, the parent prints which rank, which signal and the collective the rank was in (the
// communicator records it in a page the two share) and exits 3; the launcher then ends the
// other ranks and exits 3 itself. The child dies with its parent (PR_SET_PDEATHSIG), signals
// the launcher sends the parent (SIGTERM, SIGINT) are forwarded, and every other exit status
// passes through unchanged. PTOOL_NO_SUPERVISOR=1 turns it off.
#pragma once

#include <optional>
#include <string>

namespace ptool {

// Call first thing in main(). Under a launcher (and unless PTOOL_NO_SUPERVISOR=1) the parent
// returns the exit code the process must end with; the child, and every process not started
// by a launcher, gets nullopt and goes on.
std::optional<int> supervise_rank();

// What this rank is doing, for the supervisor's message: "in all_reduce#12 float32 [16, 10]".
// A no-op when the process is not supervised; safe to call from any thread.
void set_rank_activity(const std::string& activity);

// The supervisor's report for a child that ended with wait status `status` (tested directly).
// Returns the exit code and fills `message` (empty when the status passes through unchanged).
int supervised_exit(int status, const std::string& rank, const std::string& activity, bool forwarded_signal,
                    std::string& message);

}  // namespace ptool
