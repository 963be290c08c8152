// bench_comm: all_reduce / all_gather / reduce_scatter bandwidth, with nccl-tests' definitions
// (doc/PERFORMANCE.md): algbw = bytes / time; busbw = algbw * 2(n-1)/n for all_reduce and
// algbw * (n-1)/n for all_gather and reduce_scatter (bytes = the full tensor). Printed next to
// single-thread memcpy bandwidth measured in the same run (cuda: device-to-device copy bandwidth).
// busbw models links between devices. Virtual ranks in one memory (threads, cuda_local) have no
// links: every rank's buffer sits in the same RAM or HBM, and the collective's cost is the bytes
// it must read and write there. For those the bench also prints that traffic's rate, against the
// copy's own read + write rate: all_reduce reads n inputs and writes n outputs (2nB), all_gather
// reads B and writes nB, reduce_scatter reads nB and writes B ((n+1)B each).
//   ./build/bench/bench_comm [RANKS] [MAX_MIB]          threads, in-process (default 4 ranks, 256 MiB)
//   ./build/bench/bench_comm RANKS MAX_MIB cuda         verify's choice: nccl with a GPU per rank, else
//   cuda_local
//   ./build/bench/bench_comm RANKS MAX_MIB cuda_local   RANKS virtual ranks on one GPU
//   ./build/bench/bench_comm RANKS MAX_MIB nccl         one GPU per rank (RANKS <= GPUs)
//   mpirun -np 4 ./build/bench/bench_comm 0 [MAX_MIB]    mpi
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/collective.h"
#include "comm/comm_choice.h"
#include "comm/comm_mpi.h"
#include "comm/comm_nccl.h"
#include "comm/comm_threads.h"

using namespace ptool;
using Clock = std::chrono::steady_clock;

namespace {

double memcpy_gbps(size_t bytes) {
    std::vector<char> a(bytes, 1), b(bytes, 2);
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
        auto t0 = Clock::now();
        std::memcpy(b.data(), a.data(), bytes);
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return bytes / best / 1e9;
}

double device_copy_gbps(size_t bytes, Device device) {  // one device-to-device copy, as memcpy_gbps
    backend_for(device);
    Tensor a({static_cast<int64_t>(bytes / 4)}, DType::float32, device), b = a.clone();
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
        auto t0 = Clock::now();
        copy_bytes(b.raw(), device, a.raw(), device, bytes);  // synchronous
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return bytes / best / 1e9;
}

struct Row {
    size_t bytes;
    double seconds[3];
};

// Collective over c: times each op at each size; rank 0's numbers are returned.
std::vector<Row> measure(Communicator& c, size_t max_bytes, Device device = Device::cpu) {
    std::vector<Row> rows;
    const int n = c.size();
    for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
        const int64_t elems = static_cast<int64_t>(bytes / 4);
        const int64_t padded = (elems + n - 1) / n * n;  // all_gather / reduce_scatter need n equal chunks
        Tensor full({padded}, DType::float32, device), part({padded / n}, DType::float32, device);
        const int iters = static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / bytes, 3, 200));
        Row r{bytes, {}};
        for (int op = 0; op < 3; ++op) {
            auto run = [&] {
                if (op == 0) c.all_reduce(full, ReduceOp::sum);
                if (op == 1) c.all_gather(part, full);
                if (op == 2) c.reduce_scatter(full, part, ReduceOp::sum);
            };
            run();  // warm-up
            c.barrier();
            auto t0 = Clock::now();
            for (int i = 0; i < iters; ++i) run();
            c.barrier();
            r.seconds[op] = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
        }
        rows.push_back(r);
    }
    return rows;
}

void print(const std::vector<Row>& rows, int n, const char* backend, double memcpy_bw,
           bool one_memory = false) {
    std::printf("bench_comm %s, %d ranks; %s %.2f GB/s (the limit)\n", backend, n,
                std::string(backend) == "threads" || std::string(backend) == "mpi" ? "single-thread memcpy"
                                                                                   : "device-to-device copy",
                memcpy_bw);
    const Collective ops[3] = {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter};
    std::printf("%12s  %26s  %26s  %26s\n", "", collective_name(ops[0]), collective_name(ops[1]),
                collective_name(ops[2]));
    std::printf("%12s  %8s %8s %8s  %8s %8s %8s  %8s %8s %8s\n", "bytes", "us", "algbw", "busbw", "us",
                "algbw", "busbw", "us", "algbw", "busbw");
    double factor[3];  // nccl-tests' bus factors (comm/collective.h)
    for (int op = 0; op < 3; ++op) factor[op] = collective_row(ops[op]).bus_factor(n);
    const double traffic[3] = {2.0 * n, n + 1.0,
                               n + 1.0};  // bytes read + written per byte of the full tensor
    double worst_large = 1e30, worst_traffic[3] = {1e30, 1e30, 1e30};
    for (const Row& r : rows) {
        std::printf("%12zu ", r.bytes);
        for (int op = 0; op < 3; ++op) {
            const double alg = r.bytes / r.seconds[op] / 1e9, bus = alg * factor[op];
            std::printf("  %8.1f %8.2f %8.2f", r.seconds[op] * 1e6, alg, bus);
            if (r.bytes >= (size_t{64} << 20) && n > 1) {
                worst_large = std::min(worst_large, bus);
                worst_traffic[op] = std::min(worst_traffic[op], alg * traffic[op]);
            }
        }
        std::printf("\n");
    }
    if (worst_large < 1e30)
        std::printf("busbw >= 64 MiB, worst op: %.2f GB/s = %.0f%% of %s%s\n", worst_large,
                    100 * worst_large / memcpy_bw, one_memory ? "the copy" : "memcpy",
                    one_memory ? "" : " (target >= 50%)");
    if (one_memory && worst_traffic[0] < 1e30) {  // the copy reads and writes its bytes once: 2x its rate
        std::printf(
            "memory traffic (least bytes read + written) >= 64 MiB, slowest size, against the copy's %.2f "
            "GB/s:",
            2 * memcpy_bw);
        for (int op = 0; op < 3; ++op)
            std::printf(" %s %.0f GB/s = %.0f%%%s", collective_name(ops[op]), worst_traffic[op],
                        100 * worst_traffic[op] / (2 * memcpy_bw), op == 0 ? " (target >= 50%)" : "");
        std::printf("\n");
    }
}

}  // namespace

int main_impl(int argc, char** argv) {
    const int ranks = argc > 1 ? std::atoi(argv[1]) : 4;
    const size_t max_bytes = (argc > 2 ? std::atoi(argv[2]) : 256) * (size_t{1} << 20);
    const std::string mode = argc > 3 ? argv[3] : "";
    if (mode == "cuda" || mode == "cuda_local" || mode == "nccl") {
        const double dev_bw = device_copy_gbps(size_t{256} << 20, Device::cuda);
        std::vector<Row> rows;
        std::string backend;
        const auto rank = [&](Communicator& c) {
            backend_for(Device::cuda);  // this rank thread's device and stream
            auto r = measure(c, max_bytes, Device::cuda);
            if (c.rank() == 0) rows = r, backend = c.backend();
        };
        if (mode == "nccl")
            run_nccl_threads(ranks, CommOptions{}, rank);  // one GPU per rank
        else if (mode == "cuda_local")
            run_rank_threads(ranks, CommOptions{}, rank, Device::cuda);
        else
            run_ranks(ranks, CommOptions{}, rank, Device::cuda);  // what verify would pick
        print(rows, ranks, backend.c_str(), dev_bw, backend == "cuda_local");
        return 0;
    }
    const double mem_bw = memcpy_gbps(size_t{256} << 20);
    if (launched_by_mpi()) {
        mpi_init_once();
        MpiCommunicator world(MPI_COMM_WORLD, CommOptions{});
        auto rows = measure(world, max_bytes);
        if (world.rank() == 0) print(rows, world.size(), "mpi", mem_bw);
        return 0;
    }
    std::vector<Row> rows;
    run_rank_threads(ranks, CommOptions{}, [&](Communicator& c) {
        auto r = measure(c, max_bytes);
        if (c.rank() == 0) rows = r;
    });
    print(rows, ranks, "threads", mem_bw);
    return 0;
}

int main(int argc, char** argv) {
    try {
        return main_impl(argc, argv);
    } catch (const std::exception& e) {  // e.g. no GPU for the cuda mode
        std::fprintf(stderr, "%s: %s\n", "bench_comm", e.what());
        return 1;
    }
}
