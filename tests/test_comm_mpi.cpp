// The MPI communicator under mpirun: the conformance suite, and bitwise agreement with the threads
// communicator (the same inputs reduced by both give the same bytes).
//   mpirun --oversubscribe -np 4 build/tests/test_comm_mpi
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/comm_mpi.h"
#include "comm/comm_threads.h"
#include "comm_conformance.h"

using namespace ptool;

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

        int counts[2] = {rep.passed, rep.failed}, totals[2] = {0, 0};
        MPI_Allreduce(counts, totals, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        for (const auto& f : rep.failures) std::printf("rank %d FAILED: %s\n", world.rank(), f.c_str());
        if (world.rank() == 0) std::printf("mpi world %d: %d passed, %d failed\n", world.size(), totals[0], totals[1]);
        rep.failed = totals[1];
    }
    return rep.failed == 0 ? 0 : 1;
}
