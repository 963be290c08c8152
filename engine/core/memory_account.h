// Memory accounts: the tensor bytes a rank holds, by what they are for, and their peak.
//
// Two tallies. ptool's own: every Storage of the rank's thread (what verify measures, what explain's
// meta run predicts for it, equal to the byte). And the framework's: what PyTorch's caching
// allocator would hand out for the same step (torch.cuda.max_memory_allocated), which is ptool's
// storages but those ptool alone holds (TorchAlloc::ptool_only: its own stand-ins for work PyTorch
// does in place or on chip), plus what PyTorch alone holds (TorchAlloc::torch_only: FSDP2's
// retained collective buffers, the gradients set_to_none leaves unborn, AdamW foreach's
// temporaries, the upcast loss's tensors, cuBLAS's workspaces), each on the CUDA stream PyTorch
// allocates it on (AllocStream), less what PyTorch frees earlier than ptool does (torch_release).
// The framework tally is replayed through PyTorch's caching allocator (core/allocator_model.h)
// when the account models it: its reserved and allocated peaks are PyTorch's.
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
#include <cassert>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/allocator_model.h"
#include "core/pointer_map.h"

namespace ptool {

// What a tensor is for, as the code that allocates it declares (MemoryUseScope); `other` by default.
enum class MemoryUse {
    parameters,             // model parameters (TP-local, fully_shard's shards) and buffers
    gradients,              // their gradients
    optimizer,              // optimizer state (momentum, AdamW's two moments)
    activations,            // forward and backward: what modules save and their temporaries
    communication,          // redistribution buffers, gathered and packed tensors
    fsdp_unsharded,         // fully_shard's gathered parameters and their full gradients
    buckets,                // DDP's flat gradient buckets
    mixed_precision,        // the compute copies of the parameters and their gradients
    batch,                  // the step's data
    workspace,              // cuBLAS's workspaces (the framework's, allocated through its caching allocator)
    optimizer_temporaries,  // the optimizer step's temporaries (AdamW foreach's denominators)
    other,
    count_
};
constexpr int kMemoryUses = static_cast<int>(MemoryUse::count_);
const char* memory_use_name(MemoryUse u);  // "activations"

// Which tallies an allocation is in (the thread's TorchAllocScope; both by default).
enum class TorchAlloc : uint8_t { both, ptool_only, torch_only };
// The CUDA stream PyTorch allocates a block on: its caching allocator reuses a freed block only on
// the stream that allocated it (FSDP2's all-gather copy-in and reduce-scatter streams hold their own).
enum class AllocStream : uint8_t { compute, all_gather, reduce_scatter, all_reduce };

class MemoryAccount {
public:
    // key: the storage's identity, for the allocator model
    void charge(const void* key, int64_t bytes, MemoryUse use);
    void credit(const void* key, int64_t bytes, MemoryUse use);
    // PyTorch frees `key` now, while ptool keeps it: it leaves the framework tally (no-op if not in it).
    void torch_release(const void* key);
    // Also replay every charge and credit from now through PyTorch's caching allocator
    // (core/allocator_model.h; capacity 0: none): peak_reserved() and over_capacity() are then its.
    void model_allocator(size_t capacity);
    int64_t peak_reserved() const;  // since the model started (0 without it)
    // The allocator model's record of a step and its replay as the next one (AllocatorModel::
    // record_step, replay_step): false, replaying nothing, without the model or where the recorded
    // step did not hand its objects on as a steady state does.
    void record_allocator_step();
    bool replay_allocator_step();
    int64_t over_capacity() const;
    // The framework tally's peak: the allocator model's blocks in use (rounded as PyTorch's
    // max_memory_allocated counts them; 0 without it), and the tally's bytes by use at its peak.
    int64_t torch_peak() const;
    int64_t torch_at_peak(MemoryUse use) const;
    // The framework's reserved bytes by stream at its reserved peak (the pools PyTorch keeps apart).
    std::array<int64_t, 4> torch_reserved_by_stream_at_peak() const;
    int64_t live() const;
    int64_t peak() const;
    int64_t at_peak(MemoryUse use) const;  // bytes of `use` live at the peak
    // Starts a new peak from what is live now (after the model is built: a step's peak); the
    // allocator model starts over with what is live (AllocatorModel::restart).
    void reset_peak();
    // Also keep the framework tally's peak within each phase (MemoryPhaseScope: "layers.1.attn_block/b"),
    // from now.
    void track_phases();
    std::map<std::string, int64_t> phase_peaks() const;
    // Only the calling thread allocates, frees and reads under this account from now on (a
    // simulated rank's: train/simulate.h), so charge and credit take no lock: a simulated step
    // charges and credits millions of times, and the lock's atomics were 4% of the planner's time.
    // A real run's account stays locked (a rank thread's tensors may be freed elsewhere). Builds
    // with assertions check that only the thread that set it charges and credits.
    void set_single_thread();

private:
    mutable std::mutex mu_;
    bool single_thread_ = false;
    std::thread::id owner_;  // set_single_thread's caller
    std::unique_lock<std::mutex> guard() const {
        assert(!single_thread_ || std::this_thread::get_id() == owner_);
        return single_thread_ ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(mu_);
    }
    int64_t live_ = 0, peak_ = 0;
    std::array<int64_t, kMemoryUses> live_by_{}, at_peak_{};
    bool track_phases_ = false;
    // by "fqn/pass": hashed, as a step charges a new pass every few allocations (phase_peaks sorts)
    std::unordered_map<std::string, int64_t> phase_peaks_;
    std::unique_ptr<AllocatorModel> allocator_;
    struct TorchEntry {
        int64_t bytes;
        MemoryUse use;
    };
    PointerMap<TorchEntry> torch_;      // the framework tally's live keys
    PointerMap<char> torch_only_keys_;  // in the framework tally alone
    int64_t torch_live_ = 0, torch_peak_logical_ = 0;
    std::array<int64_t, kMemoryUses> torch_live_by_{}, torch_at_peak_{};
    void torch_charge(const void* key, int64_t bytes, MemoryUse use);
    void torch_release_locked(const void* key);
    // the last charged phase scope's entry (MemoryPhaseScope): a pass charges many times, and its
    // key is built once
    uint64_t phase_scope_ = 0;
    std::string phase_key_;  // the lookup's, its buffer reused
    int64_t* phase_peak_ = nullptr;
    int64_t& phase_entry();
    // each module's pass entries ('f', 'b', 'r') by the address of its name (a scope's fqn, which
    // outlives it): a step enters a new pass every few allocations, and hashing its key was 2% of the
    // planner; each entry's key is compared with the name before it is taken
    struct PhaseSlot {
        const std::string* key = nullptr;  // phase_peaks_'s
        int64_t* peak = nullptr;
    };
    PointerMap<std::array<PhaseSlot, 3>> phase_by_fqn_;
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

// The tallies and the stream the calling thread's allocations go to while in scope, restored after.
class TorchAllocScope {
public:
    explicit TorchAllocScope(TorchAlloc kind, AllocStream stream = AllocStream::compute);
    ~TorchAllocScope();
    TorchAllocScope(const TorchAllocScope&) = delete;
    TorchAllocScope& operator=(const TorchAllocScope&) = delete;

private:
    TorchAlloc saved_kind_;
    AllocStream saved_stream_;
};

// For Storage: the calling thread's account and use now.
std::shared_ptr<MemoryAccount> current_memory_account();
MemoryUse current_memory_use();

}  // namespace ptool
