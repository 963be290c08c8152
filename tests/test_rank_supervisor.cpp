// The rank supervisor's verdicts for each way a supervised rank can end (the fork itself is
// exercised end to end under mpirun by mpi_fault_test.sh).
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "comm/rank_supervisor.h"
#include "test_helpers.h"

using namespace ptool;

namespace {
int status_of_child(void (*body)()) {  // a real wait status, not a hand-made bit pattern
    const pid_t pid = fork();
    if (pid == 0) {
        // the child dies of its signal as a rank would: Catch's fatal-signal handlers (which
        // allocate, unsafe in a handler: TSan reports it) are not the rank's
        for (int sig : {SIGTERM, SIGSEGV, SIGABRT, SIGINT}) signal(sig, SIG_DFL);
        body(), _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}
}  // namespace

TEST_CASE("supervisor: exit codes pass through unchanged", "[cpu]") {
    std::string msg;
    CHECK(supervised_exit(status_of_child([] { _exit(0); }), "1", "", false, msg) == 0);
    CHECK(msg.empty());
    CHECK(supervised_exit(status_of_child([] { _exit(1); }), "1", "in all_reduce#3", false, msg) == 1);
    CHECK(supervised_exit(status_of_child([] { _exit(2); }), "0", "", false, msg) == 2);
    CHECK(msg.empty());
}

TEST_CASE("supervisor: a rank killed by a signal is exit 3 naming rank, signal and collective", "[cpu]") {
    std::string msg;
    CHECK(supervised_exit(status_of_child([] { raise(SIGKILL); }), "3", "in all_reduce#12 float32 [16, 10]",
                          false, msg) == 3);
    CHECK(msg == "rank 3 was killed by signal 9 (SIGKILL) in all_reduce#12 float32 [16, 10]");
    CHECK(supervised_exit(status_of_child([] { raise(SIGSEGV); }), "0", "", false, msg) == 3);
    CHECK(msg == "rank 0 was killed by signal 11 (SIGSEGV) before its first collective");
}

TEST_CASE("supervisor: a rank stopped by the launcher says so", "[cpu]") {
    std::string msg;
    CHECK(supervised_exit(status_of_child([] { raise(SIGTERM); }), "2", "after broadcast#0 float32 [4]", true,
                          msg) == 3);
    CHECK(
        msg ==
        "rank 2 stopped by the launcher (SIGTERM) after broadcast#0 float32 [4]: another rank failed, or the "
        "job was cancelled");
}

TEST_CASE("supervisor: not under a launcher, the process is not forked", "[cpu]") {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) unsetenv(v);
    const pid_t before = getpid();
    CHECK_FALSE(supervise_rank().has_value());
    CHECK(getpid() == before);
    set_rank_activity("in all_reduce#0");  // unsupervised: a no-op, must not crash
}
