// The cores this process may run on: its CPU affinity mask (taskset, a Slurm job step's or a
// container's cpuset), not every CPU of the machine (std::thread::hardware_concurrency, which a
// 4-core Slurm step on a 128-CPU node reads as 128: rank threads would then not take turns, and
// each comparison would start eight threads). At least 1.
#pragma once

namespace ptool {

int usable_cores();

}  // namespace ptool
