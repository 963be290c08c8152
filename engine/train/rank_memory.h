// One rank's tensor memory over a run's steps (core/memory_account.h): measured by verify (the
// bytes its tensors held), predicted by train/simulate.h (the same steps on meta tensors).
#pragma once

#include <array>
#include <cstdint>

#include "core/memory_account.h"

namespace ptool {

struct RankMemory {
    int rank = 0;
    int64_t peak = 0;      // the steps' peak of live tensor bytes (after the model is built)
    int64_t resident = 0;  // live when the first step starts: parameters, gradients, buffers, the batch
    std::array<int64_t, kMemoryUses> at_peak{};  // the peak by use
};

}  // namespace ptool
