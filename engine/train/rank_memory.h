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
    // the first step's own peak (predicted: train/simulate.h; 0 where not recorded): the optimizer's
    // state does not exist before its first step (torch.optim creates it lazily), so a later step's
    // peak can be higher by that state's bytes
    int64_t first_step_peak = 0;
    // predicted only (train/simulate.h): what PyTorch's caching allocator would reserve at most for
    // the tensors (core/allocator_model.h), from before the model is built; segments it had to
    // grant beyond the capacity it was given
    int64_t reserved_peak = 0;
    int64_t over_capacity = 0;
    // predicted only: the framework tally's (core/framework_memory.h) allocated peak, PyTorch's
    // torch.cuda.max_memory_allocated for the step (blocks rounded as its allocator counts them),
    // its bytes by use at that peak, and the reserved bytes per stream at the reserved peak
    int64_t torch_peak = 0, torch_first_step_peak = 0;
    std::array<int64_t, kMemoryUses> torch_at_peak{};
    std::array<int64_t, 4> reserved_by_stream{};
};

}  // namespace ptool
