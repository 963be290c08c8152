// The CPU backend's loops over independent elements or rows on several threads: as many as its
// GEMMs take (OpenBLAS's count, which GemmThreadShare divides among rank threads sharing the
// cores, so verify's ranks do not oversubscribe them). Each element is computed by the same
// arithmetic in the same order as the one-thread loop, so the results are bitwise that loop's;
// a sum across elements stays on one thread (or its per-row parts are added in row order).
#pragma once

#include <cstdint>
#include <functional>

namespace ptool {

// fn(begin, end) over [0, n) in contiguous chunks of at least `grain` (all of it on the calling
// thread when n < 2 * grain or one thread is allowed).
void cpu_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// The grain for elementwise loops: 2^16 elements (tens of microseconds of work a chunk, against
// a thread's start of about as much).
constexpr int64_t kElementGrain = int64_t{1} << 16;

}  // namespace ptool
