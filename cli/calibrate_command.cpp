// ptool calibrate --device cuda|cpu -o FILE: this machine's kernel table (plan/calibrate.h), the
// file a cluster's `kernels:` names (docs/kernel_table.md).
#include "cli/commands.h"
#include "core/file_roles.h"
#include "core/files.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"

namespace ptool::cli {

void add_calibrate_command(CLI::App& app, Common& common) {
    struct Args {
        std::string out, cluster;
        bool quick = false;
    };
    auto a = std::make_shared<Args>();
    CLI::App* cmd = app.add_subcommand("calibrate",
                                       "Measure this machine's kernel table (GEMMs by shape, attention, "
                                       "memory-bound ops) with ptool's backend "
                                       "and write the file a cluster's `kernels:` names");
    cmd->add_option("--device", common.device, "cuda (cuBLAS and ptool's kernels on GPU 0) or cpu")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("-o,--output", a->out, "the kernel table to write (JSON)")
        ->required()
        ->check(output_path());
    cmd->add_option(
        "--cluster", a->cluster,
        "the cluster file of this machine: its peaks are the table's scale (default: the vendor's "
        "for a known GPU, else the best measured rates)");
    cmd->add_flag("--quick", a->quick, "a smaller grid (a check of the path, seconds)");
    cmd->callback([a, &common] {
        // the cluster first: the kernel table it names is an input (`-o` naming it was refused only
        // after the measurements)
        const Cluster c = a->cluster.empty() ? Cluster{} : load_cluster(a->cluster);
        FileRoles()
            .input("--cluster", a->cluster)
            .input("--cluster's kernels", c.kernels_path)
            .output("-o", a->out)
            .check();
        check_output(a->out, true);
        CalibrateOptions o;
        o.device = select_device(common);  // cuda without a GPU: exit 3 naming why
        o.quick = a->quick || o.device == Device::cpu;
        if (!a->cluster.empty()) {
            o.peak_flops = c.flops, o.peak_bandwidth = c.memory_bandwidth;
            o.peak_source = fmt::format("{}'s tflops and memory_bandwidth_gb_s", a->cluster);
        }
        o.progress = [](const std::string& line) { fmt::print(stderr, "calibrate: {}\n", line); };
        const KernelTable t = calibrate(o);
        write_file(a->out, kernel_table_json(t), true);
        fmt::print("wrote {}: {} GEMMs, {} attention rows, {} memory ops on {}\n", a->out, t.gemm.size(),
                   t.attention.size(), t.memory.size(), t.gpu);
    });
}

}  // namespace ptool::cli
