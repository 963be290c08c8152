// Independent jobs on a few threads: fn(i) for every i in [0, n), on up to `threads` threads (0: one
// per core), the calling thread among them. After all have run, the exception of the lowest i that
// threw, if any, is rethrown. The planner simulates ranks and candidates with it.
#pragma once

#include <cstddef>
#include <functional>

namespace ptool {

void parallel_for(size_t n, unsigned threads, const std::function<void(size_t)>& fn);

}  // namespace ptool
