// Memory accounts: the tensor bytes a rank holds, by what they are for, and their peak.
//
// Every Storage charges its bytes to the account of the thread that allocated it (none: not
// counted) under the thread's current use, and credits them back when it is freed, from whatever
// thread. A real run's rank thread and a simulated one (train/simulate.h: the step executed on
// meta tensors) count the same way, so the predicted peak and the measured one are the same
// quantity: the tensors' logical bytes (not what a caching allocator reserves).
//
//   auto account = std::make_shared<MemoryAccount>();
//   { MemoryScope scope(account); ... Run run(...); account->reset_peak(); run.step(0); }
//   account->peak(), account->at_peak(MemoryUse::activations)
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/allocator_model.h"

namespace ptool {

// What a tensor is for, as the code that allocates it declares (MemoryUseScope); `other` by default.
enum class MemoryUse {
    parameters,       // model parameters (TP-local, fully_shard's shards) and buffers
    gradients,        // their gradients
    optimizer,        // optimizer state (momentum, AdamW's two moments)
    activations,      // forward and backward: what modules save and their temporaries
    communication,    // redistribution buffers, gathered and packed tensors
    fsdp_unsharded,   // fully_shard's gathered parameters and their full gradients
    buckets,          // DDP's flat gradient buckets
    mixed_precision,  // the compute copies of the parameters and their gradients
    batch,            // the step's data
    other,
    count_
};
constexpr int kMemoryUses = static_cast<int>(MemoryUse::count_);
const char* memory_use_name(MemoryUse u);  // "activations"

class MemoryAccount {
public:
    // key: the storage's identity, for the allocator model
    void charge(const void* key, int64_t bytes, MemoryUse use);
    void credit(const void* key, int64_t bytes, MemoryUse use);
    // Also replay every charge and credit from now through PyTorch's caching allocator
    // (core/allocator_model.h; capacity 0: none): peak_reserved() and over_capacity() are then its.
    void model_allocator(size_t capacity);
    int64_t peak_reserved() const;  // since the model started (0 without it)
    int64_t over_capacity() const;
    int64_t live() const;
    int64_t peak() const;
    int64_t at_peak(MemoryUse use) const;  // bytes of `use` live at the peak
    // Starts a new peak from what is live now (after the model is built: a step's peak); the
    // allocator model starts over with what is live (AllocatorModel::restart).
    void reset_peak();
    // Also keep the peak within each phase (MemoryPhaseScope: "layers.1.attn_block/b"), from now.
    void track_phases();
    std::map<std::string, int64_t> phase_peaks() const;

private:
    mutable std::mutex mu_;
    int64_t live_ = 0, peak_ = 0;
    std::array<int64_t, kMemoryUses> live_by_{}, at_peak_{};
    bool track_phases_ = false;
    std::map<std::string, int64_t> phase_peaks_;
    std::unique_ptr<AllocatorModel> allocator_;
    // the last charged phase's entry: a pass charges many times, and its key is built once
    const std::string* phase_fqn_ = nullptr;
    std::string phase_fqn_text_;
    char phase_pass_ = 0;
    int64_t* phase_peak_ = nullptr;
    int64_t& phase_entry();
};

// The calling thread's account while in scope (null: nothing counted, e.g. verification's own
// gathers inside a run), restored after.
class MemoryScope {
public:
    explicit MemoryScope(std::shared_ptr<MemoryAccount> account);
    ~MemoryScope();
    MemoryScope(const MemoryScope&) = delete;
    MemoryScope& operator=(const MemoryScope&) = delete;

private:
    std::shared_ptr<MemoryAccount> saved_;
};

// The use the calling thread's allocations are charged to while in scope.
class MemoryUseScope {
public:
    explicit MemoryUseScope(MemoryUse use);
    ~MemoryUseScope();
    MemoryUseScope(const MemoryUseScope&) = delete;
    MemoryUseScope& operator=(const MemoryUseScope&) = delete;

private:
    MemoryUse saved_;
};

// The module and pass the calling thread's allocations happen in while in scope ('f' forward,
// 'b' backward, 'r' a checkpoint's recompute), for accounts that track phases: the planner
// extrapolates each phase's peak over repeated blocks (plan/search.h). `fqn` must outlive it.
class MemoryPhaseScope {
public:
    MemoryPhaseScope(const std::string& fqn, char pass);
    ~MemoryPhaseScope();
    MemoryPhaseScope(const MemoryPhaseScope&) = delete;
    MemoryPhaseScope& operator=(const MemoryPhaseScope&) = delete;

private:
    const std::string* saved_fqn_;
    char saved_pass_;
};

// For Storage: the calling thread's account and use now.
std::shared_ptr<MemoryAccount> current_memory_account();
MemoryUse current_memory_use();

}  // namespace ptool
