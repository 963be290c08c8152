// `ptool calibrate`: a kernel table (plan/kernel_table.h) measured on this machine with ptool's own
// backend: cuBLAS's GEMMs on a GPU (OpenBLAS's on the CPU) over a grid of shapes for the three
// layouts of a linear, ptool's attention (its GEMMs and softmax per head: unfused, where PyTorch's
// table measures FlashAttention), and its memory-bound kernels (copy, add, the loss with its
// upcast). Each measurement: two warm-up calls, then enough calls for `target_seconds`, timed on
// the host around a synchronisation of the backend's stream.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "plan/kernel_table.h"

namespace ptool {

struct CalibrateOptions {
    Device device = Device::cuda;
    bool quick = false;             // a smaller grid (a check of the path; the CPU's default)
    double target_seconds = 0.004;  // per measurement, after its warm-up
    // the vendor's dense peaks the rows are measured against (the scale a GPU without a table is
    // derived by): a cluster file's, else the table of known GPUs by name, else the measured best
    std::map<DType, double> peak_flops;
    double peak_bandwidth = 0;
    std::string peak_source;
    std::function<void(const std::string&)> progress;  // a line per part measured (may be empty)
};

// Throws RuntimeError naming why when the device cannot be used (no GPU: why_none).
KernelTable calibrate(const CalibrateOptions& o);
// The table as the file `kernels:` names (format "ptool kernel table 1"), one row a line.
std::string kernel_table_json(const KernelTable& t);
// Known GPUs' dense peaks by device name (H100 SXM, H100 PCIe, H200, A100): empty when unknown.
std::optional<std::pair<std::map<DType, double>, double>> known_gpu_peaks(const std::string& device_name);

}  // namespace ptool
