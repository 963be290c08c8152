// comm_fault MODE: a deliberately failing MPI job, for tests/mpi_fault_test.sh.
//   throw: rank 1 throws after the first collective; timeout: rank 1 is stuck for 20 s (1 s timeout);
//   mismatch: rank 1 calls all_reduce while the others call all_gather;
//   kill: rank 1 is killed by SIGKILL after the first collective (the supervisor reports it);
//   p2p_timeout: rank 1 receives from rank 0, which never sends; p2p_mismatch: rank 0 sends
//   [16, 10], rank 1 expects [16, 20]; p2p_throw: rank 0 waits in a recv from rank 1, which throws.
// Every mode must end all ranks with exit 3 and a message naming the rank and collective (or
// both ranks of the point-to-point op and its tag).
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
        if (mode == "p2p_timeout") {
            if (c.rank() == 1) c.recv(t, 0, 7);
            std::this_thread::sleep_for(
                std::chrono::seconds(20));  // the others: until rank 1's error ends the job
        } else if (mode == "p2p_mismatch") {
            Tensor wide({16, 20}, DType::float32);
            if (c.rank() == 0) c.send(t, 1, 7);
            if (c.rank() == 1) c.recv(wide, 0, 7);
            std::this_thread::sleep_for(std::chrono::seconds(20));
        } else if (mode == "p2p_throw") {
            MpiCommunicator patient(MPI_COMM_WORLD,
                                    CommOptions{});  // 300 s: only the job's end stops its wait
            if (c.rank() == 1) throw std::runtime_error("injected failure");
            if (c.rank() == 0) patient.recv(t, 1, 0);
            std::this_thread::sleep_for(std::chrono::seconds(20));
        } else if (mode == "timeout" && c.rank() == 1) {
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
    } catch (const RuntimeError& e) {
        mpi_abort_job(
            e.names_rank() ? e.what() : fmt::format("rank {} failed: {}", mpi_world_rank(), e.what()), 3);
    } catch (const std::exception& e) {
        mpi_abort_job(fmt::format("rank {} failed: {}", mpi_world_rank(), e.what()), 3);
    }
    return 0;
}
