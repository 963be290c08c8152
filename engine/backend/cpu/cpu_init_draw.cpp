// Parameter initialisation from the counter-based RNG on the host's cores (Backend::draw_init).
// The local elements are cut into jobs of kDrawJob, drawn on every core (parallel_for: an init is
// not a rank's step, and a verify's rank threads initialise one after another), each job's runs
// of consecutive global indices 4096 at a time through CounterRng's 16-lane runs. A value depends
// on its global index alone, so the result is bitwise that of one thread drawing in order
// (tests/test_init_draw.cpp compares the two on odd sizes and shards).
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "core/parallel_for.h"
#include "core/rng.h"

namespace ptool {
namespace {

// Elements a job draws: large enough that a thread's start (tens of microseconds) is small against
// its draw, small enough that a 2-core machine's threads share a tensor evenly.
constexpr int64_t kDrawJob = int64_t{1} << 18;

template <class T>
void draw_jobs(T* p, int64_t n, int64_t run, const InitDraw& d) {
    const CounterRng rng(d.seed, d.stream);  // its runs read nothing it remembers: shared by the jobs
    const double lo = -d.scale, width = 2.0 * d.scale;
    auto job = [&](size_t j) {
        double v[4096];
        const int64_t end = std::min(n, static_cast<int64_t>(j + 1) * kDrawJob);
        for (int64_t i = static_cast<int64_t>(j) * kDrawJob; i < end;) {
            const int64_t outer = i / run, within = i % run;
            const int64_t len = std::min({int64_t{4096}, run - within, end - i});
            const auto first = static_cast<uint64_t>((outer * d.full_len + d.offset) * d.inner + within);
            if (d.normal) {
                rng.normal_run(first, len, v);
                for (int64_t k = 0; k < len; ++k) p[i + k] = T(static_cast<acc_t<T>>(d.scale * v[k]));
            } else {
                rng.uniform_run(first, len, v);
                for (int64_t k = 0; k < len; ++k) p[i + k] = T(static_cast<acc_t<T>>(lo + width * v[k]));
            }
            i += len;
        }
    };
    const size_t jobs = static_cast<size_t>((n + kDrawJob - 1) / kDrawJob);
    if (jobs == 1) return job(0);
    if (jobs > 1) parallel_for(jobs, 0, job);
}

}  // namespace

void CpuBackend::draw_init(Tensor& t, const InitDraw& d) {
    dispatch_float(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        draw_jobs<T>(t.data<T>(), d.run > 0 ? t.numel() : 0, d.run, d);
    });
}

}  // namespace ptool
