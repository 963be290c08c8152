#include "backend/cpu/cpu_threads.h"

#include <cblas.h>

#include <algorithm>

#include "core/parallel_for.h"

namespace ptool {

void cpu_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t threads = std::max(1, openblas_get_num_threads());
    const int64_t chunks = std::min(threads, grain > 0 ? n / grain : n);
    if (chunks <= 1) {
        if (n > 0) fn(0, n);
        return;
    }
    parallel_for(static_cast<size_t>(chunks), static_cast<unsigned>(chunks), [&](size_t c) {
        const int64_t i = static_cast<int64_t>(c);
        fn(n * i / chunks, n * (i + 1) / chunks);
    });
}

}  // namespace ptool
