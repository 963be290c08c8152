// The CUDA backend against the CPU backend (the oracle): every case of the op-case table
// (op_cases.h: each op of backend.h in float32, float64 and bfloat16, each output held to its
// tolerance), plus what is no single op's comparison: an id outside the vocabulary named, draw_init
// bitwise at sizes that fill the grid, fused attention bitwise run to run, the caching allocator's
// counters, the device communicators (cuda_local, nccl) and redistribution on the device. Needs a
// GPU: without one the binary prints why and exits 4, which ctest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/gpu_info.h"
#include "comm/comm_nccl.h"
#include "comm/comm_threads.h"
#include "comm_conformance.h"
#include "core/rng.h"
#include "core/tensor_ops.h"
#include "model/float8_gemm.h"
#include "op_cases.h"
#include "parallel/redistribute.h"

using namespace ptool;
using testing::uniform_tensor;

namespace {

Backend& cpu() {
    return backend_for(Device::cpu);
}
Backend& gpu() {
    return backend_for(Device::cuda);
}

Tensor on_gpu(const Tensor& t) {
    return t.to_device(Device::cuda);
}

// The point-to-point failure cases' job on in-process ranks (cuda_local or nccl).
FailureLauncher launcher(const std::function<void(int n, const CommOptions&, const RankFn&)>& run_ranks) {
    FailureLauncher launch;
    launch.run = [run_ranks](double timeout, const RankFn& body) {
        CommOptions o;
        o.timeout_seconds = timeout;
        FailureRun out;
        const auto t0 = std::chrono::steady_clock::now();
        try {
            run_ranks(2, o, body);
        } catch (const RuntimeError& e) {
            out.message = e.what();
        }
        out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return out;
    };
    return launch;
}

}  // namespace

// Each case set up on the CPU and on the GPU from the same drawn inputs, run on each, and every
// output the GPU wrote held to the CPU's by the tolerance the table gives it.
TEST_CASE("cuda runs every case of the op-case table as the cpu does, within each output's tolerance",
          "[cuda]") {
    int compared = 0;
    for (const testing::OpRow& row : testing::op_table())
        for (DType dt : testing::kOpDtypes)
            for (const testing::OpCase& c : row.cases(dt)) {
                if (c.compared_on && !c.compared_on(gpu())) continue;  // float64 at hd 256: no fused kernel
                INFO(row.op << " " << dtype_name(dt) << " " << c.label);
                testing::OpRun ref = c.setup(cpu()), run = c.setup(gpu());
                ref.op(), run.op();
                const std::vector<testing::OpOutput> want = ref.outputs(), got = run.outputs();
                REQUIRE(got.size() == want.size());
                for (size_t i = 0; i < want.size(); ++i) {
                    const testing::OpComparison cmp =
                        testing::compare_output(want[i], got[i].value, row.op + " " + want[i].name);
                    INFO(cmp.message);
                    CHECK(cmp.bad == 0);
                }
                ++compared;
            }
    CHECK(compared > 100);
}

TEST_CASE("cuda embedding names a token id outside the vocabulary and its position", "[cuda]") {
    for (DType dt : testing::kOpDtypes) {
        Tensor w = uniform_tensor({50, 24}, dt, 16), bad = testing::id_tensor({4, 9}, 50, 17);
        bad.data<int64_t>()[3] = -1;  // another rank's row: skipped, not an error
        bad.data<int64_t>()[5] = 50;
        Tensor gy({4, 9, 24}, dt, Device::cuda);
        CHECK_THROWS_WITH(gpu().embedding(on_gpu(bad), on_gpu(w), gy),
                          Catch::Contains("token id 50 at position 5"));
    }
}

// Initialisation drawn on the device (cuda_init_draw.cu: uniform by a kernel, normal on the host's
// cores and copied) bitwise the CPU's draw, whole and as shards along each dim, in every dtype.
TEST_CASE("cuda draw_init is bitwise the cpu's draw", "[cuda]") {
    struct Shard {
        Shape local;
        int64_t run, full_len, inner, offset;
    };
    const Shard shards[] = {
        {{1000003}, 1000003, 1000003, 1, 0},        // whole
        {{517, 513}, 513, 1031, 1, 401},            // a column shard of [517, 1031]
        {{259, 1033}, 259 * 1033, 777, 1033, 259},  // a row shard of [777, 1033]
    };
    for (DType dt : testing::kOpDtypes)
        for (const Shard& sh : shards)
            for (bool normal : {false, true}) {
                InitDraw d;
                d.seed = 20261128, d.stream = stream_id("init", "layers.0.weight"), d.normal = normal;
                d.scale = normal ? 0.02 : 0.03125, d.run = sh.run, d.full_len = sh.full_len,
                d.inner = sh.inner, d.offset = sh.offset;
                Tensor host = Tensor::empty(sh.local, dt), dev = Tensor::empty(sh.local, dt, Device::cuda);
                cpu().draw_init(host, d);
                gpu().draw_init(dev, d);
                const Tensor back = dev.to_device(Device::cpu);
                INFO(dtype_name(dt) << " " << shape_str(sh.local) << (normal ? " normal" : " uniform"));
                CHECK(std::memcmp(back.raw(), host.raw(), host.nbytes()) == 0);
            }
}

// torchao's float8 casts emulated on a GPU's tensors (model/float8_gemm.h: staged through the host,
// the CUDA backend has no float8 kernels yet) bitwise the host's, in the input's dtype; the GEMM of
// the float8 values (cuBLAS's float32 GEMM, the host's OpenBLAS) within float32 rounding of a sum of
// K products; the codes FSDP2's float8 all-gather writes, and their decode, bitwise.
TEST_CASE("cuda float8 casts are bitwise the host's, their GEMM within float32 rounding", "[cuda]") {
    auto host_of = [](const Tensor& t) { return t.to_device(Device::cpu); };
    auto same = [](const Tensor& a, const Tensor& b) {
        return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
    };
    for (DType dt : {DType::float32, DType::bfloat16}) {
        INFO(dtype_name(dt));
        const Tensor x = uniform_tensor({37, 64}, dt, 31, -3.0, 3.0), w = uniform_tensor({48, 64}, dt, 32);
        const Tensor xd = on_gpu(x), wd = on_gpu(w);
        CHECK(float8_amax(xd) == float8_amax(x));
        CHECK(float8_amax_axis(xd, 1) == float8_amax_axis(x, 1));
        const Float8Operand a = float8_tensorwise(x, Float8Format::e4m3fn, float8_amax(x)),
                            ad = float8_tensorwise(xd, Float8Format::e4m3fn, float8_amax(xd));
        CHECK(ad.values.device() == Device::cuda);
        CHECK(ad.scale == a.scale);
        CHECK(same(host_of(ad.values), a.values));
        const Float8Operand b = float8_axiswise(w, Float8Format::e4m3fn, float8_amax_axis(w, 0), 0, true),
                            bd = float8_axiswise(wd, Float8Format::e4m3fn, float8_amax_axis(wd, 0), 0, true);
        CHECK(bd.scales == b.scales);
        CHECK(same(host_of(bd.values), b.values));
        const Float8Operand ar = float8_axiswise(x, Float8Format::e4m3fn, float8_amax_axis(x, 0), 0, true),
                            ard = float8_axiswise(xd, Float8Format::e4m3fn, float8_amax_axis(xd, 0), 0, true);
        // y = x w^T: tensorwise x with rowwise-by-output w is not a recipe; each recipe's own pairing
        for (bool rowwise : {false, true}) {
            const Float8Operand& l = rowwise ? ar : a;
            const Float8Operand& ld = rowwise ? ard : ad;
            const Float8Operand r = rowwise ? b : float8_tensorwise(w, Float8Format::e4m3fn, float8_amax(w));
            const Float8Operand rd =
                rowwise ? bd : float8_tensorwise(wd, Float8Format::e4m3fn, float8_amax(wd));
            Tensor y({37, 48}, DType::float32), yd({37, 48}, DType::float32, Device::cuda);
            float8_gemm(cpu(), l, false, r, true, y);
            float8_gemm(gpu(), ld, false, rd, true, yd);
            const std::vector<double> want = y.to_doubles(), got = yd.to_doubles();
            // each order's sum of K products within (K - 1) u sum |products| of the exact one, each
            // product at most 448^2 before the scales (u = 2^-24): the two within 2 K^2 u 448^2 / (sa sb)
            double worst = 0;
            for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(want[i] - got[i]));
            const double sa = rowwise ? *std::min_element(ar.scales.begin(), ar.scales.end()) : a.scale,
                         sb = rowwise ? *std::min_element(b.scales.begin(), b.scales.end()) : r.scale;
            INFO("rowwise " << rowwise << " worst " << worst);
            CHECK(worst <= 2.0 * 64 * 64 * std::ldexp(1.0, -24) * 448.0 * 448.0 / (sa * sb));
        }
        Tensor codes(Shape{48, 64}, DType::uint8), codes_d(Shape{48, 64}, DType::uint8, Device::cuda);
        float8_cast_codes(w, Float8Format::e4m3fn, 64.0f, codes);
        float8_cast_codes(wd, Float8Format::e4m3fn, 64.0f, codes_d);
        CHECK(same(host_of(codes_d), codes));
        CHECK(same(host_of(float8_from_codes(codes_d, Float8Format::e4m3fn, 64.0f).values),
                   float8_from_codes(codes, Float8Format::e4m3fn, 64.0f).values));
    }
}

TEST_CASE("cuda fused attention is bitwise the same run to run", "[cuda]") {
    AttentionArgs a;
    a.batch = 2, a.heads = 4, a.kv_heads = 2, a.causal = true, a.scale = 0.125, a.o_merged = true;
    const Tensor q = on_gpu(uniform_tensor({8, 300, 64}, DType::float32, 50)),
                 k = on_gpu(uniform_tensor({4, 300, 64}, DType::float32, 51)),
                 v = on_gpu(uniform_tensor({4, 300, 64}, DType::float32, 52)),
                 d_o = on_gpu(uniform_tensor({2, 300, 256}, DType::float32, 53));
    std::vector<std::vector<double>> runs;
    for (int r = 0; r < 2; ++r) {
        Tensor o({2, 300, 256}, DType::float32, Device::cuda), m({8, 300}, DType::float32, Device::cuda),
            l({8, 300}, DType::float32, Device::cuda), dq({8, 300, 64}, DType::float32, Device::cuda),
            dk({4, 300, 64}, DType::float32, Device::cuda), dv({4, 300, 64}, DType::float32, Device::cuda);
        gpu().attention_forward(a, q, k, v, o, m, l);
        gpu().attention_backward(a, q, k, v, o, d_o, m, l, dq, dk, dv, false);
        std::vector<double> all;
        for (const Tensor* t : {&o, &dq, &dk, &dv})
            for (double x : t->to_device(Device::cpu).to_doubles()) all.push_back(x);
        runs.push_back(all);
    }
    CHECK(runs[0] == runs[1]);
}

TEST_CASE("cuda tensors: copies, views and the caching allocator's counters", "[cuda]") {
    const AllocatorStats before = cuda_memory_stats();
    {
        Tensor h = uniform_tensor({64, 30}, DType::float32, 27);
        Tensor g = on_gpu(h);
        CHECK(cuda_memory_stats().in_use >= before.in_use + 64 * 30 * 4);
        CHECK(g.narrow(1, 5, 10).to_device(Device::cpu).to_doubles() == h.narrow(1, 5, 10).to_doubles());
        CHECK(g.narrow(0, 3, 4).item(7) == h.narrow(0, 3, 4).item(7));
        g.set(11, 42.0);
        CHECK(g.item(11) == 42.0);
        CHECK(g.to(DType::float64).to_device(Device::cpu).item(0) == h.item(0));
    }
    const AllocatorStats after = cuda_memory_stats();
    CHECK(after.in_use == before.in_use);  // every block came back
    CHECK(after.peak_in_use >= before.in_use + 64 * 30 * 4);
}

TEST_CASE("cuda_local passes the communicator conformance suite at world sizes 1 to 8", "[cuda]") {
    for (int n = 1; n <= 8; ++n) {
        const auto [report, name] = run_conformance_on_ranks(
            [&](const RankFn& fn) {
                run_rank_threads(
                    n, CommOptions{},
                    [&](Communicator& comm) {
                        gpu();  // this rank thread: the device and its own stream
                        fn(comm);
                    },
                    Device::cuda);
            },
            Device::cuda);
        INFO("world size " << n << ": " << (report.failures.empty() ? "" : report.failures[0]));
        CHECK(report.failed == 0);
        CHECK(report.passed > 0);
        CHECK(name == "cuda_local");
    }
}

TEST_CASE(
    "cuda_local point-to-point failures end every rank within the timeout, naming both ranks and the tag",
    "[cuda]") {
    ConformanceReport rep;
    run_p2p_failure_conformance(launcher([](int n, const CommOptions& o, const RankFn& body) {
                                    run_rank_threads(
                                        n, o,
                                        [&](Communicator& c) {
                                            gpu();
                                            body(c);
                                        },
                                        Device::cuda);
                                }),
                                rep, Device::cuda);
    INFO((rep.failures.empty() ? "" : rep.failures[0]));
    CHECK(rep.failed == 0);
    CHECK(rep.passed == 6);
}

TEST_CASE("cuda_local redistributes shards of any dim on the device, bitwise the host's", "[cuda]") {
    // shards of dims other than 0 travel packed (pack_chunks): strided device copies, no host trip
    for (const Shape& shape : {Shape{5, 7, 3}, Shape{4, 6}})
        for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
            for (int n : {2, 3}) {
                INFO("shape " << shape_str(shape) << " dim " << d << " world size " << n);
                const Tensor full = uniform_tensor(shape, DType::float32, 51);
                std::vector<int> gathered(n, 0), scattered(n, 0);
                run_rank_threads(
                    n, CommOptions{},
                    [&](Communicator& c) {
                        gpu();
                        const Tensor local = on_gpu(chunk(full, n, c.rank(), d));
                        const Tensor g = full_tensor(local, Placement::shard(d), shape, c);
                        gathered[c.rank()] = g.device() == Device::cuda &&
                                             g.to_device(Device::cpu).to_doubles() == full.to_doubles();
                        const Tensor mine =
                            redistribute(on_gpu(full), Placement::partial(), Placement::shard(d), shape, c);
                        Tensor sum = full.clone();
                        cpu().scale(full, static_cast<double>(n),
                                    sum);  // n equal summands: fl(n x) either way
                        scattered[c.rank()] = mine.to_device(Device::cpu).to_doubles() ==
                                              chunk(sum, n, c.rank(), d).to_doubles();
                    },
                    Device::cuda);
                for (int r = 0; r < n; ++r) {
                    CHECK(gathered[r] == 1);
                    CHECK(scattered[r] == 1);
                }
            }
}

// nccl at world size 1 runs on every GPU machine; sizes 2..8 where the machine has the GPUs.
TEST_CASE("nccl passes the communicator conformance suite on one GPU per rank", "[cuda]") {
    const int gpus = static_cast<int>(query_gpus().devices.size());
    for (int n = 1; n <= std::min(gpus, 8); ++n) {
        const auto [report, name] = run_conformance_on_ranks(
            [&](const RankFn& fn) { run_nccl_threads(n, CommOptions{}, fn); }, Device::cuda);
        INFO("world size " << n << ": " << (report.failures.empty() ? "" : report.failures[0]));
        CHECK(report.failed == 0);
        CHECK(report.passed > 0);
        CHECK(name == "nccl");
    }
}

TEST_CASE("nccl: host tensors are staged through the device, results bitwise the threads communicator's",
          "[cuda]") {
    Tensor t = uniform_tensor({37, 5}, DType::float32, 41);
    Tensor on_threads = t.clone(), on_nccl = t.clone();
    run_rank_threads(1, CommOptions{}, [&](Communicator& c) { c.all_reduce(on_threads, ReduceOp::avg); });
    run_nccl_threads(1, CommOptions{}, [&](Communicator& c) { c.all_reduce(on_nccl, ReduceOp::avg); });
    CHECK(on_nccl.device() == Device::cpu);
    CHECK(on_nccl.to_doubles() == on_threads.to_doubles());
}

// Failure paths need two ranks, so two GPUs; a one-GPU machine reports the case as not run.
TEST_CASE("a nccl rank that never arrives times out on every rank, a mismatch is named", "[cuda]") {
    if (query_gpus().devices.size() < 2) {
        WARN("needs 2 GPUs: not run on this machine");
        return;
    }
    CommOptions quick;
    quick.timeout_seconds = 1;
    CHECK_THROWS_WITH(run_nccl_threads(2, quick,
                                       [&](Communicator& c) {
                                           Tensor x = Tensor({4}, DType::float32, Device::cuda);
                                           if (c.rank() == 1)
                                               c.all_reduce(x, ReduceOp::sum);
                                           else
                                               std::this_thread::sleep_for(
                                                   std::chrono::seconds(3));  // rank 0 never arrives
                                       }),
                      Catch::Contains("rank 1 timed out after 1 s in all_reduce#0"));
    CHECK_THROWS_WITH(
        run_nccl_threads(2, CommOptions{},
                         [&](Communicator& c) {
                             Tensor x = Tensor({4 + c.rank()}, DType::float32, Device::cuda);
                             c.all_reduce(x, ReduceOp::sum);
                         }),
        Catch::Contains(
            "collective mismatch: rank 1 all_reduce#0 float32 [5] vs rank 0 all_reduce#0 float32 [4]"));
}

TEST_CASE("nccl point-to-point failures end every rank within the timeout, naming both ranks and the tag",
          "[cuda]") {
    if (query_gpus().devices.size() < 2) {
        WARN("needs 2 GPUs: not run on this machine");
        return;
    }
    ConformanceReport rep;
    run_p2p_failure_conformance(
        launcher([](int n, const CommOptions& o, const RankFn& body) { run_nccl_threads(n, o, body); }), rep,
        Device::cuda);
    INFO((rep.failures.empty() ? "" : rep.failures[0]));
    CHECK(rep.failed == 0);
    CHECK(rep.passed == 6);
}

int main(int argc, char** argv) {
    const GpuInfo info = query_gpus();
    if (info.devices.empty()) {
        std::printf("SKIP: the CUDA backend tests need a GPU: %s\n", info.why_none.c_str());
        return 4;
    }
    backend_for(Device::cuda);  // selects the CUDA backend, as --device cuda does: device tensors need it
    return Catch::Session().run(argc, argv);
}
