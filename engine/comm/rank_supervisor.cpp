#include "comm/rank_supervisor.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ptool {
namespace {

constexpr size_t activity_bytes = 256;
char* shared_activity = nullptr;  // MAP_SHARED page: written by the child, read by the parent
std::mutex activity_mutex;
volatile pid_t child_pid = 0;
volatile sig_atomic_t forwarded = 0;

void forward_signal(int sig) {
    forwarded = 1;
    if (child_pid > 0) kill(child_pid, sig);
}

bool launched() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::string launcher_rank() {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
        if (const char* r = std::getenv(v)) return r;
    return "?";
}

}  // namespace

int supervised_exit(int status, const std::string& rank, const std::string& activity, bool forwarded_signal,
                    std::string& message) {
    message.clear();
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (!WIFSIGNALED(status)) return 3;
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    const std::string name = abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
    const std::string where = activity.empty() ? "before its first collective" : activity;
    if (forwarded_signal)
        message = fmt::format(
            "rank {} stopped by the launcher ({}) {}: another rank failed, or the job was cancelled", rank,
            name, where);
    else
        message = fmt::format("rank {} was killed by signal {} ({}) {}", rank, sig, name, where);
    return 3;
}

std::optional<int> supervise_rank() {
    if (!launched()) return std::nullopt;
    if (const char* off = std::getenv("PTOOL_NO_SUPERVISOR"); off && std::strcmp(off, "0") != 0)
        return std::nullopt;
    void* page = mmap(nullptr, activity_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return std::nullopt;  // unsupervised is still correct, only less informative
    shared_activity = static_cast<char*>(page);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) return std::nullopt;
    if (pid == 0) {  // the rank
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(3);  // the supervisor died before prctl took effect
        return std::nullopt;
    }
    child_pid = pid;
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaction(sig, &sa, nullptr);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return 3;
    std::string activity(shared_activity, strnlen(shared_activity, activity_bytes));
    std::string message;
    const int code = supervised_exit(status, launcher_rank(), activity, forwarded != 0, message);
    if (!message.empty()) std::fprintf(stderr, "error: %s\n", message.c_str()), std::fflush(stderr);
    return code;
}

void set_rank_activity(const std::string& activity) {
    if (!shared_activity) return;
    std::lock_guard lock(activity_mutex);
    const size_t n = std::min(activity.size(), activity_bytes - 1);
    std::memcpy(shared_activity, activity.data(), n);
    shared_activity[n] = '\0';
}

}  // namespace ptool
