// comm_fault MODE: a deliberately failing MPI job, for tests/mpi_fault_test.sh.
//   throw: rank 1 throws after the first collective; timeout: rank 1 is stuck for 20 s (1 s timeout);
//   mismatch: rank 1 calls all_reduce while the others call all_gather;
//   kill: rank 1 is killed by SIGKILL after the first collective (the supervisor reports it).
// Every mode must end all ranks with exit 3 and a message naming the rank and collective.
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include "comm/comm_mpi.h"
#include "comm/rank_supervisor.h"

using namespace ptool;

int main(int argc, char** argv) {
    if (std::optional<int> code = supervise_rank()) return *code;
    const std::string mode = argc > 1 ? argv[1] : "";
    mpi_init_once();
    try {
        CommOptions o;
        o.timeout_seconds = 1.0;
        MpiCommunicator c(MPI_COMM_WORLD, o);
        Tensor t({16, 10}, DType::float32);
        c.all_reduce(t, ReduceOp::sum);
        if (mode == "throw" && c.rank() == 1) throw std::runtime_error("injected failure");
        if (mode == "kill" && c.rank() == 1) std::raise(SIGKILL);
        if (mode == "timeout" && c.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::seconds(20));  // stuck: the others wait in all_reduce#1
            c.all_reduce(t, ReduceOp::sum);
        } else if (mode == "mismatch" && c.rank() == 1) {
            c.all_reduce(t, ReduceOp::sum);
        } else if (mode == "mismatch") {
            Tensor in({4, 10}, DType::float32), out({4 * c.size(), 10}, DType::float32);
            c.all_gather(in, out);
        } else {
            c.all_reduce(t, ReduceOp::sum);
        }
    } catch (const std::exception& e) {
        const std::string what = e.what();
        mpi_abort_job(what.rfind("collective mismatch", 0) == 0 ? what
                                                                : fmt::format("rank {} failed: {}", mpi_world_rank(), what),
                      3);
    }
    return 0;
}
