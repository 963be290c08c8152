// The MPI communicator under mpirun: the conformance suite (point-to-point included), bitwise
// agreement with the threads communicator (the same inputs reduced by both give the same bytes),
// the point-to-point failure cases (each on a fresh communicator) and the MPI check macro.
//   mpirun --oversubscribe -np 4 build/tests/test_comm_mpi
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/comm_mpi.h"
#include "comm/comm_threads.h"
#include "comm_conformance.h"
#include "core/check.h"

using namespace ptool;

namespace {

// A failure case on a fresh communicator (a failed op's leftovers match nothing later); every
// rank gets every rank's message, joined in rank order.
FailureRun mpi_failure(double timeout, const RankFn& body) {
    CommOptions o;
    o.timeout_seconds = timeout;
    const auto t0 = std::chrono::steady_clock::now();
    std::string mine;
    {
        MpiCommunicator c(MPI_COMM_WORLD, o);
        try {
            body(c);
        } catch (const RuntimeError& e) {
            mine = e.what();
        }
    }
    constexpr int kBytes = 512;
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<char> out(kBytes, 0), all(static_cast<size_t>(kBytes) * size);
    std::memcpy(out.data(), mine.data(), std::min<size_t>(mine.size(), kBytes - 1));
    MPI_Allgather(out.data(), kBytes, MPI_CHAR, all.data(), kBytes, MPI_CHAR, MPI_COMM_WORLD);
    FailureRun run;
    for (int r = 0; r < size; ++r) {
        const std::string m(all.data() + static_cast<size_t>(r) * kBytes);
        if (!m.empty()) run.message += (run.message.empty() ? "" : "; ") + m;
    }
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return run;
}

}  // namespace

int main() {
    mpi_init_once();
    ConformanceReport rep;
    {
        MpiCommunicator world(MPI_COMM_WORLD, CommOptions{});
        run_comm_conformance(world, rep);

        // the same all_reduce on threads and on MPI: bitwise equal
        auto input = [](int rank) {
            Tensor t({3001}, DType::float32);
            for (int64_t i = 0; i < 3001; ++i) t.set(i, std::sin(0.37 * i + rank) * 1e3);
            return t;
        };
        Tensor mine = input(world.rank());
        world.all_reduce(mine, ReduceOp::sum);
        Tensor threads_result;
        run_rank_threads(world.size(), CommOptions{}, [&](Communicator& c) {
            Tensor t = input(c.rank());
            c.all_reduce(t, ReduceOp::sum);
            if (c.rank() == 0) threads_result = t;
        });
        rep.expect(std::memcmp(mine.raw(), threads_result.raw(), mine.nbytes()) == 0,
                   "mpi and threads all_reduce give different bytes");

        run_p2p_failure_conformance(FailureLauncher{mpi_failure, false}, rep);

        // the MPI check: the statement, file:line and MPI's words (MPI_COMM_WORLD returns errors)
        try {
            PTOOL_CHECK_MPI(MPI_Send(nullptr, -1, MPI_BYTE, 0, 0, MPI_COMM_WORLD));
            rep.expect(false, "PTOOL_CHECK_MPI let a failed call pass");
        } catch (const RuntimeError& e) {
            const std::string what = e.what();
            rep.expect(
                what.rfind("MPI_Send(nullptr, -1, MPI_BYTE, 0, 0, MPI_COMM_WORLD) failed at ", 0) == 0 &&
                    what.find("test_comm_mpi.cpp:") != std::string::npos &&
                    what.find(mpi_error_string(MPI_ERR_COUNT)) != std::string::npos,
                "PTOOL_CHECK_MPI's message: " + what);
        }

        int counts[2] = {rep.passed, rep.failed}, totals[2] = {0, 0};
        MPI_Allreduce(counts, totals, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        for (const auto& f : rep.failures) std::printf("rank %d FAILED: %s\n", world.rank(), f.c_str());
        if (world.rank() == 0)
            std::printf("mpi world %d: %d passed, %d failed\n", world.size(), totals[0], totals[1]);
        rep.failed = totals[1];
    }
    return rep.failed == 0 ? 0 : 1;
}
