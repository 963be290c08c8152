// Two pipeline stages as two MPI processes (mpirun -np 2): each stage's parameters, gradients,
// outputs and losses equal the one-stage run's bitwise (tests/pipeline_cases.h), its activations
// and gradients sent between processes by the MPI communicator's send/recv.
//   mpirun --oversubscribe -np 2 build/tests/test_pipeline_mpi
#include <fstream>
#include <sstream>

#include "comm/comm_mpi.h"
#include "comm/comm_threads.h"
#include "pipeline_cases.h"

using namespace ptool;
using namespace ptool::pipeline_test;

int main() {
    mpi_init_once();
    MpiCommunicator world(MPI_COMM_WORLD, CommOptions{});
    if (world.size() != 2) {
        std::fprintf(stderr, "test_pipeline_mpi: run with mpirun -np 2 (got %d ranks)\n", world.size());
        return 2;
    }
    int failures = 0, checks = 0;
    for (const Case& c : cases()) {
        const RunInputs in = inputs(c);
        std::vector<Snapshot> one;  // every process runs the one-stage reference itself
        const Plan one_device = one_device_plan(c);
        run_rank_threads(1, CommOptions{}, [&](Communicator& w) {
            Run run(in, one_device, w);
            one = steps_of(run, 2);
        });
        const Plan plan = pipeline_plan(c);
        Run run(in, plan, world);
        const std::vector<Snapshot> mine = steps_of(run, 2);
        for (int k = 0; k < 2; ++k) {
            ++checks;
            for (const std::string& d : differences(one[k], mine[k], run.stage() == 1, k)) {
                std::fprintf(stderr, "FAIL %s split at %s, %s: stage %d: %s\n", c.model.c_str(),
                             c.split.c_str(), schedule_kind_name(c.schedule), run.stage(), d.c_str());
                ++failures;
            }
        }
    }
    Tensor t = Tensor::scalar(failures, DType::float64).reshape({1});
    world.all_reduce(t, ReduceOp::sum);
    if (world.rank() == 0)
        std::printf("test_pipeline_mpi: %d stage-steps checked per rank, %d failures on all ranks\n", checks,
                    static_cast<int>(t.item(0)));
    return t.item(0) == 0 ? 0 : 1;
}
