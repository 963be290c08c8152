// ptool --version: the version and what this build can use (CUDA runtime and devices, cuBLAS,
// NCCL, MPI, OpenBLAS), so a bug report says which backends a run could have taken.
#include <cblas.h>
#include <fmt/format.h>
#include <mpi.h>

#include "backend/gpu_info.h"
#include "cli/commands.h"

namespace ptool::cli {

std::string version_text() {
    std::string s = fmt::format("ptool {}\n", PTOOL_VERSION);
    const GpuInfo g = query_gpus();
    if (!g.built_with_cuda) {
        s += "  CUDA: not built (CPU only)\n";
    } else {
        s += fmt::format("  CUDA: runtime {}.{}, driver {}, cuBLAS {}\n", g.runtime_version / 1000,
                         g.runtime_version % 1000 / 10,
                         g.driver_version
                             ? fmt::format("{}.{}", g.driver_version / 1000, g.driver_version % 1000 / 10)
                             : std::string("none"),
                         [] {
                             const int v = query_cublas_version();
                             return v ? fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
                                      : std::string("not found");
                         }());
        s += g.nccl_version ? fmt::format("  NCCL: {}.{}.{}\n", g.nccl_version / 10000,
                                          g.nccl_version / 100 % 100, g.nccl_version % 100)
                            : std::string("  NCCL: not found\n");
        if (g.devices.empty()) s += fmt::format("  GPUs: none ({})\n", g.why_none);
        for (size_t i = 0; i < g.devices.size(); ++i)
            s += fmt::format("  GPU {}: {}, sm_{}, {:.1f} GiB\n", i, g.devices[i].name,
                             g.devices[i].compute_capability,
                             static_cast<double>(g.devices[i].memory_bytes) / (1ull << 30));
    }
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(mpi, &len);
    std::string m(mpi, static_cast<size_t>(len));
    if (auto nl = m.find_first_of(",\n"); nl != std::string::npos) m.resize(nl);
    s += fmt::format("  MPI: {}\n", m);
    s += fmt::format("  OpenBLAS: {}", openblas_get_config());
    return s;
}

}  // namespace ptool::cli
