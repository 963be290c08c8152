// GEMM on the CPU: cblas_sgemm / cblas_dgemm; 16-bit inputs are widened to float, multiplied
// with sgemm (fp32 accumulation) and rounded once on store.
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/cores.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace ptool {
namespace {

template <class T>
void gemm_blas(const T* a, bool ta, const T* b, bool tb, T* c, const GemmDims& d, double alpha, double beta) {
    const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    const int lda = static_cast<int>(ta ? d.m : d.k), ldb = static_cast<int>(tb ? d.k : d.n);
    for (int64_t i = 0; i < d.batch; ++i) {
        const T* ai = a + i * d.m * d.k;
        const T* bi = d.b_shared ? b : b + i * d.k * d.n;
        T* ci = c + i * d.m * d.n;
        if constexpr (std::is_same_v<T, double>) {
            cblas_dgemm(CblasRowMajor, opa, opb, d.m, d.n, d.k, alpha, ai, lda, bi, ldb, beta, ci, d.n);
        } else {
            cblas_sgemm(CblasRowMajor, opa, opb, d.m, d.n, d.k, static_cast<float>(alpha), ai, lda, bi, ldb,
                        static_cast<float>(beta), ci, d.n);
        }
    }
}

template <class T>
std::vector<float> widen(const Tensor& t) {
    std::vector<float> out(t.numel());
    const T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(p[i]);
    return out;
}

}  // namespace

void CpuBackend::gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double alpha,
                      double beta) {
    require_same_dtype(a, b, "gemm");
    require_same_dtype(a, c, "gemm");
    GemmDims d = gemm_dims(a, ta, b, tb, c);
    if (d.m == 0 || d.n == 0) return;
    if (d.k == 0) {  // an empty sum: c = beta * c (an uneven shard can hold no columns)
        if (beta == 0.0)
            fill(c, 0.0);
        else
            scale(c, beta, c);
        return;
    }
    dispatch_float(a.dtype(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
            gemm_blas<T>(a.data<T>(), ta, b.data<T>(), tb, c.data<T>(), d, alpha, beta);
        } else {
            std::vector<float> fa = widen<T>(a), fb = widen<T>(b), fc = widen<T>(c);
            gemm_blas<float>(fa.data(), ta, fb.data(), tb, fc.data(), d, alpha, beta);
            T* pc = c.data<T>();
            for (int64_t i = 0; i < c.numel(); ++i) pc[i] = T(fc[i]);
        }
    });
}

namespace {

// OpenBLAS's pthread workers spin (sched_yield) for 2^28 TSC cycles, about 0.1 s, after each job
// before they sleep. Verify's rank threads, its comparison and its model construction run in those
// gaps and lost a core's third to the spinning (perf: 10% of a bench_verify's cycles in
// sched_yield). Where the user has not chosen (OPENBLAS_THREAD_TIMEOUT), the spin is cut to 2^20
// cycles (about 0.4 ms: back-to-back GEMMs still find the workers awake): the variable is set, the
// library rereads its environment and its workers are stopped; its next threaded GEMM starts them
// again with the new timeout (the path a forked child takes). Builds without those entry points
// (another BLAS, OpenBLAS with OpenMP) keep their own behaviour.
bool quiet_blas_workers() {
    if (std::getenv("OPENBLAS_THREAD_TIMEOUT") || std::getenv("GOTO_THREAD_TIMEOUT")) return false;
    auto read_env = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "openblas_read_env"));
    auto shutdown = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
    if (!read_env || !shutdown) return false;
    setenv("OPENBLAS_THREAD_TIMEOUT", "20", 0);
    read_env();
    shutdown();
    return true;
}
const bool kBlasWorkersQuiet = quiet_blas_workers();  // at start-up, before any other thread

}  // namespace

namespace {

// OpenBLAS maps a buffer of 128 MiB (its BUFFER_SIZE on x86-64) for each thread in a GEMM at once,
// the callers' (rank threads: one a core at most, as they compute holding one) and its own
// workers', and keeps it for the next caller; where the map fails it
// retries without end (0.3.21's blas_memory_alloc). Measured (2026-11-30, Debian's 0.3.21 pthread:
// a second thread's first sgemm grew VmSize by 136 MiB, its stack with it). Only a limit on the
// address space (`ulimit -v`) makes the map fail before the memory is used: there, the buffers of
// every thread that may call it must fit in what is left, or the run is refused before its threads
// start, where it would hang (exit 3 naming the limit).
void require_blas_address_space(int callers, int workers) {
    constexpr int64_t kPerThread = int64_t{136} << 20;
    const int64_t left = address_space_left();
    const int64_t need = kPerThread * (callers + workers);
    if (left < 0 || left >= need) return;
    throw RuntimeError(fmt::format(
        "the address space left under this process's limit (ulimit -v) is {} MiB, and OpenBLAS maps "
        "a 128 MiB buffer (with a thread's stack, 136 MiB) for each of the {} threads that may be in a "
        "GEMM at once ({} of ptool's rank thread{} and {} of its own), retrying without end where a map "
        "fails: out of "
        "address space before the run starts (raise the limit to at least {} MiB more, or run fewer "
        "ranks a process)",
        left >> 20, callers + workers, callers, callers == 1 ? "" : "s", workers,
        (need - left + (1 << 20) - 1) >> 20));
}

}  // namespace

GemmThreadShare::GemmThreadShare(int ranks, int rank_threads) : saved_(openblas_get_num_threads()) {
    (void)kBlasWorkersQuiet;
    const int threads = threads_for(saved_, ranks);
    // a rank thread computes while it holds a core (CoreSlots): at most one a core is in a GEMM
    require_blas_address_space(std::clamp(usable_cores(), 1, std::max(1, rank_threads)), threads - 1);
    openblas_set_num_threads(threads);
}

GemmThreadShare::~GemmThreadShare() {
    openblas_set_num_threads(saved_);
}

std::string CpuBackend::name() const {
    const char* config = openblas_get_config();
    return fmt::format("cpu ({})", config ? config : "OpenBLAS");
}

}  // namespace ptool
