// bench_compare: verify's element comparison (compare_piece: max abs/rel error, ULPs, headroom and
// the exact Frobenius sums) on a float32 gradient-sized tensor, against reading the same two
// tensors with memcpy's rate measured in the same run (a comparison reads both once).
//   ./build/bench/bench_compare [ELEMENTS]      (default 8M: gemm_mlp's net1.weight is 4M)
// Rows: one thread (a rank comparing its own piece) and the helper threads (rank 0 comparing a
// replicated tensor alone); tensors that differ in every element by about one ULP (gradients of
// GEMMs blocked differently), in one element of 10^4 (parameters after an SGD step on such
// gradients: the update rarely moves the rounding) and not at all (the memcmp fast path).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gemm_limit.h"
#include "verify/compare.h"
#include "verify/digest.h"

using namespace ptool;

using bench::best_seconds;

int main(int argc, char** argv) {
    const int64_t n = argc > 1 ? std::stoll(argv[1]) : int64_t{8} << 20;
    Tensor expected({n}, DType::float32), actual({n}, DType::float32), same({n}, DType::float32),
        rare({n}, DType::float32);
    const CounterRng rng(1, 2);
    float *e = expected.data<float>(), *a = actual.data<float>();
    for (int64_t i = 0; i < n; ++i) {
        e[i] = static_cast<float>(rng.normal(static_cast<uint64_t>(i)) * 1e-3);
        a[i] = e[i] * (1.0f + 1.2e-7f * static_cast<float>(i % 3 - 1));  // within a ULP or two
    }
    std::memcpy(same.raw(), expected.raw(), expected.nbytes());
    std::memcpy(rare.raw(), expected.raw(), expected.nbytes());
    for (int64_t i = 0; i < n; i += 10007) rare.data<float>()[i] = a[i];
    std::vector<char> sink(expected.nbytes());
    const double read = best_seconds(5, [&] {  // two tensors' bytes read (one copy reads one, writes one)
        std::memcpy(sink.data(), expected.raw(), expected.nbytes());
        std::memcpy(sink.data(), actual.raw(), actual.nbytes());
    });
    const Tolerance tol = Tolerance::for_policy(DType::float32, DType::float32, 3);
    const std::vector<int64_t> origin = {0};
    std::printf("bench_compare: %lld float32 elements; reading both with memcpy: %.2f ms = %.2f ns/element\n",
                static_cast<long long>(n), read * 1e3, read * 1e9 / static_cast<double>(n));
    std::printf("  %-34s %10s %12s %10s\n", "case", "ms", "ns/element", "x memcpy");
    struct Case {
        const char* name;
        const Tensor& actual;
    };
    for (bool threads : {false, true})
        for (const Case& c : {Case{"differ by ~1 ULP", actual}, Case{"1 in 10^4 differs", rare},
                              Case{"bitwise equal", same}}) {
            TensorDiff d;
            const double t = best_seconds(5, [&] {
                d = finish_diff(
                    compare_piece(c.actual, expected, origin, tol, threads ? compare_threads() : 1), tol);
            });
            std::printf("  %-34s %10.2f %12.2f %10.2f  max_ulp %lld\n",
                        (std::string(c.name) + (threads ? ", helper threads" : ", one thread")).c_str(),
                        t * 1e3, t * 1e9 / static_cast<double>(n), t / read,
                        static_cast<long long>(d.max_ulp));
        }
    // replicas are compared by digest (every rank hashes its copy), construction state by element hash
    uint64_t sink_digest = 0;
    const double digest = best_seconds(5, [&] { sink_digest += tensor_digest(actual); });
    const double element =
        best_seconds(5, [&] { sink_digest += element_hash_sum(actual, actual.shape(), origin); });
    std::printf("  %-34s %10.2f %12.2f %10.2f\n", "tensor_digest (replicas)", digest * 1e3,
                digest * 1e9 / static_cast<double>(n), digest / read);
    std::printf("  %-34s %10.2f %12.2f %10.2f  (%llx)\n", "element_hash_sum (construction)", element * 1e3,
                element * 1e9 / static_cast<double>(n), element / read,
                static_cast<unsigned long long>(sink_digest & 0xf));
    return 0;
}
