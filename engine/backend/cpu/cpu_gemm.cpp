// GEMM on the CPU: cblas_sgemm / cblas_dgemm; 16-bit inputs are widened to float, multiplied
// with sgemm (fp32 accumulation) and rounded once on store.
#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "backend/cpu/cpu_backend.h"

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

GemmThreadShare::GemmThreadShare(int ranks) : saved_(openblas_get_num_threads()) {
    (void)kBlasWorkersQuiet;
    openblas_set_num_threads(threads_for(saved_, ranks));
}

GemmThreadShare::~GemmThreadShare() {
    openblas_set_num_threads(saved_);
}

std::string CpuBackend::name() const {
    const char* config = openblas_get_config();
    return fmt::format("cpu ({})", config ? config : "OpenBLAS");
}

}  // namespace ptool
