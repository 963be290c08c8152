// Which communicator a job gets and which GPU an mpirun process takes: pure logic, so it is
// tested on every machine (the GPU paths it selects run in test_cuda_backend / cli_test on a GPU).
#include <cstdlib>

#include "comm/comm_choice.h"
#include "test_helpers.h"

using namespace ptool;

namespace {
// Sets the launcher variables for one test and removes every one of them afterwards.
struct LauncherEnv {
    static constexpr const char* kAll[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "SLURM_LOCALID",
                                           "SLURM_NTASKS_PER_NODE",
                                           "MPI_LOCALRANKID",
                                           "MPI_LOCALNRANKS"};
    LauncherEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
        clear();
        for (const auto& [k, v] : vars) setenv(k, v, 1);
    }
    ~LauncherEnv() { clear(); }
    static void clear() {
        for (const char* k : kAll) unsetenv(k);
    }
};
}  // namespace

TEST_CASE("the in-process communicator follows the device and the GPU count", "[cpu]") {
    CHECK(in_process_comm(Device::cpu, 8, 8) == CommKind::threads);
    CHECK(in_process_comm(Device::cuda, 8, 8) == CommKind::nccl);  // one rank per GPU
    CHECK(in_process_comm(Device::cuda, 4, 8) == CommKind::nccl);
    CHECK(in_process_comm(Device::cuda, 8, 1) == CommKind::cuda_local);  // one H100 verifies a TP=8 plan
    CHECK(in_process_comm(Device::cuda, 8, 7) == CommKind::cuda_local);
    CHECK(in_process_comm(Device::cuda, 1, 8) == CommKind::cuda_local);  // no collective crosses a device
    CHECK(std::string(comm_kind_name(CommKind::nccl)) == "nccl");
    CHECK(std::string(comm_kind_name(CommKind::cuda_local)) == "cuda_local");
}

TEST_CASE("the node-local rank comes from OpenMPI, Slurm or MPICH variables", "[cpu]") {
    {
        LauncherEnv env({});
        CHECK(launcher_local_rank().rank == -1);
    }
    {
        LauncherEnv env({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}});
        CHECK(launcher_local_rank().rank == 3);
        CHECK(launcher_local_rank().size == 8);
    }
    {
        LauncherEnv env({{"SLURM_LOCALID", "1"}});
        CHECK(launcher_local_rank().rank == 1);
        CHECK(launcher_local_rank().size == -1);
    }
    {
        LauncherEnv env({{"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "4"}});
        CHECK(launcher_local_rank().rank == 2);
    }
    {
        LauncherEnv env({{"OMPI_COMM_WORLD_LOCAL_RANK", "x1"}});  // not a number: not known
        CHECK(launcher_local_rank().rank == -1);
    }
}

TEST_CASE("an mpirun process takes the GPU of its node-local rank, one rank per GPU", "[cpu]") {
    CHECK(gpu_for_local_rank({0, 8}, 8) == 0);
    CHECK(gpu_for_local_rank({7, 8}, 8) == 7);
    CHECK(gpu_for_local_rank({2, -1}, 4) == 2);  // the size unknown: the rank still has to fit
    require_input_error([] { gpu_for_local_rank({0, 2}, 1); }, {"runs 2 ranks", "sees 1 GPU", "cuda_local"});
    require_input_error([] { gpu_for_local_rank({4, -1}, 4); }, {"runs 5 ranks", "sees 4 GPUs"});
    require_input_error(
        [] {
            gpu_for_local_rank({-1, -1}, 4);
        },
        {"node-local rank", "OMPI_COMM_WORLD_LOCAL_RANK"});
    CHECK_THROWS_WITH(gpu_for_local_rank({0, 1}, 0),
                      Catch::Contains("no CUDA device is available on this node"));
}
