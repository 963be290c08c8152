#include "core/memory_account.h"

#include <algorithm>
#include <atomic>

namespace ptool {
namespace {
thread_local std::shared_ptr<MemoryAccount> t_account;
thread_local MemoryUse t_use = MemoryUse::other;
thread_local const std::string* t_phase_fqn = nullptr;
thread_local char t_phase_pass = 0;
// Which phase scope the thread is in: a value no other scope, on any thread, had (0: none), so that
// an account knows its last phase's entry still holds without comparing names. The thread's index
// above its own count: no atomic per scope, which the threads of a search contended for.
std::atomic<uint64_t> phase_threads{0};
thread_local uint64_t t_phase_scope = 0;
uint64_t next_phase_scope() {
    thread_local const uint64_t thread = phase_threads.fetch_add(1, std::memory_order_relaxed) << 40;
    thread_local uint64_t count = 0;
    return thread | ++count;
}
thread_local TorchAlloc t_torch = TorchAlloc::both;
thread_local AllocStream t_stream = AllocStream::compute;
}  // namespace

TorchAllocScope::TorchAllocScope(TorchAlloc kind, AllocStream stream)
    : saved_kind_(t_torch), saved_stream_(t_stream) {
    t_torch = kind, t_stream = stream;
}

TorchAllocScope::~TorchAllocScope() {
    t_torch = saved_kind_, t_stream = saved_stream_;
}

MemoryPhaseScope::MemoryPhaseScope(const std::string& fqn, char pass)
    : saved_fqn_(t_phase_fqn), saved_pass_(t_phase_pass) {
    t_phase_fqn = &fqn, t_phase_pass = pass;
    t_phase_scope = next_phase_scope();
}

MemoryPhaseScope::~MemoryPhaseScope() {
    t_phase_fqn = saved_fqn_, t_phase_pass = saved_pass_;
    t_phase_scope = next_phase_scope();
}

void MemoryAccount::track_phases() {
    std::lock_guard<std::mutex> lock(mu_);
    track_phases_ = true;
    phase_peaks_.clear();
    phase_by_fqn_.clear();
    phase_peak_ = nullptr;
}

std::map<std::string, int64_t> MemoryAccount::phase_peaks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {phase_peaks_.begin(), phase_peaks_.end()};
}

const char* memory_use_name(MemoryUse u) {
    switch (u) {
        case MemoryUse::parameters:
            return "parameters";
        case MemoryUse::gradients:
            return "gradients";
        case MemoryUse::optimizer:
            return "optimizer";
        case MemoryUse::activations:
            return "activations";
        case MemoryUse::communication:
            return "communication";
        case MemoryUse::fsdp_unsharded:
            return "fsdp_unsharded";
        case MemoryUse::buckets:
            return "buckets";
        case MemoryUse::mixed_precision:
            return "mixed_precision";
        case MemoryUse::batch:
            return "batch";
        case MemoryUse::workspace:
            return "workspace";
        case MemoryUse::optimizer_temporaries:
            return "optimizer_temporaries";
        default:
            return "other";
    }
}

void MemoryAccount::torch_charge(const void* key, int64_t bytes, MemoryUse use) {
    if (allocator_) allocator_->allocate(key, static_cast<size_t>(bytes), static_cast<uintptr_t>(t_stream));
    torch_.insert_or_assign(key, {bytes, use});
    torch_live_ += bytes;
    torch_live_by_[static_cast<int>(use)] += bytes;
    if (torch_live_ > torch_peak_logical_) torch_peak_logical_ = torch_live_, torch_at_peak_ = torch_live_by_;
    if (track_phases_) {  // the planner extrapolates the framework's peaks (plan/search.h)
        int64_t& p = phase_entry();
        p = std::max(p, torch_live_);
    }
}

void MemoryAccount::torch_release(const void* key) {
    const auto lock = guard();
    torch_release_locked(key);
}

void MemoryAccount::torch_release_locked(const void* key) {
    TorchEntry e{};
    if (!torch_.take(key, &e)) return;
    if (allocator_) allocator_->release(key);
    torch_live_ -= e.bytes;
    torch_live_by_[static_cast<int>(e.use)] -= e.bytes;
}

void MemoryAccount::charge(const void* key, int64_t bytes, MemoryUse use) {
    const auto lock = guard();
    if (t_torch != TorchAlloc::ptool_only) torch_charge(key, bytes, use);
    if (t_torch == TorchAlloc::torch_only) {
        torch_only_keys_.insert_or_assign(key, 1);
        return;
    }
    live_ += bytes;
    live_by_[static_cast<int>(use)] += bytes;
    if (live_ > peak_) peak_ = live_, at_peak_ = live_by_;
}

int64_t& MemoryAccount::phase_entry() {
    // the same scope as the last charge (a module's pass charges many times): its entry
    if (phase_peak_ && phase_scope_ == t_phase_scope) return *phase_peak_;
    phase_scope_ = t_phase_scope;
    const int pass = t_phase_pass == 'f' ? 0 : t_phase_pass == 'b' ? 1 : t_phase_pass == 'r' ? 2 : -1;
    PhaseSlot* slot = nullptr;
    if (t_phase_fqn && pass >= 0) {  // the module's pass, where its name still keys it: "fqn/pass"
        slot = &(*phase_by_fqn_.try_emplace(t_phase_fqn).first)[pass];
        const std::string& fqn = *t_phase_fqn;
        if (slot->key && slot->key->size() == fqn.size() + 2 && slot->key->compare(0, fqn.size(), fqn) == 0 &&
            slot->key->back() == t_phase_pass)
            return *(phase_peak_ = slot->peak);
    }
    if (t_phase_fqn)
        phase_key_.assign(*t_phase_fqn);
    else
        phase_key_.clear();
    if (t_phase_pass) phase_key_ += '/', phase_key_ += t_phase_pass;
    auto it = phase_peaks_.find(phase_key_);
    if (it == phase_peaks_.end()) it = phase_peaks_.emplace(phase_key_, 0).first;
    phase_peak_ = &it->second;  // a node's: the entry and its key stay where they are
    if (slot) *slot = {&it->first, phase_peak_};
    return *phase_peak_;
}

void MemoryAccount::credit(const void* key, int64_t bytes, MemoryUse use) {
    const auto lock = guard();
    const bool ptool = torch_only_keys_.empty() || !torch_only_keys_.erase(key);
    torch_release_locked(key);
    if (!ptool) return;
    live_ -= bytes;
    live_by_[static_cast<int>(use)] -= bytes;
}

void MemoryAccount::set_single_thread() {
    std::lock_guard<std::mutex> lock(mu_);
    single_thread_ = true;
    owner_ = std::this_thread::get_id();
}

void MemoryAccount::model_allocator(size_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    allocator_ = std::make_unique<AllocatorModel>(capacity);
}

void MemoryAccount::record_allocator_step() {
    std::lock_guard<std::mutex> lock(mu_);
    if (allocator_) allocator_->record_step();
}

bool MemoryAccount::replay_allocator_step() {
    std::lock_guard<std::mutex> lock(mu_);
    return allocator_ && allocator_->replay_step();
}

int64_t MemoryAccount::peak_reserved() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocator_ ? static_cast<int64_t>(allocator_->peak_reserved()) : 0;
}

int64_t MemoryAccount::over_capacity() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocator_ ? allocator_->over_capacity() : 0;
}

int64_t MemoryAccount::torch_peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocator_ ? static_cast<int64_t>(allocator_->peak_in_use()) : 0;
}

int64_t MemoryAccount::torch_at_peak(MemoryUse use) const {
    std::lock_guard<std::mutex> lock(mu_);
    return torch_at_peak_[static_cast<int>(use)];
}

std::array<int64_t, 4> MemoryAccount::torch_reserved_by_stream_at_peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::array<int64_t, 4> out{};
    if (allocator_)
        for (const auto& [stream, bytes] : allocator_->reserved_by_stream_at_peak())
            if (stream < out.size()) out[stream] = static_cast<int64_t>(bytes);
    return out;
}

int64_t MemoryAccount::live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
}

int64_t MemoryAccount::peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
}

int64_t MemoryAccount::at_peak(MemoryUse use) const {
    std::lock_guard<std::mutex> lock(mu_);
    return at_peak_[static_cast<int>(use)];
}

void MemoryAccount::reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = live_, at_peak_ = live_by_;
    torch_peak_logical_ = torch_live_, torch_at_peak_ = torch_live_by_;
    if (allocator_) allocator_->restart();
}

MemoryScope::MemoryScope(std::shared_ptr<MemoryAccount> account) : saved_(std::move(t_account)) {
    t_account = std::move(account);
}

MemoryScope::~MemoryScope() {
    t_account = std::move(saved_);
}

MemoryUseScope::MemoryUseScope(MemoryUse use) : saved_(t_use) {
    t_use = use;
}

MemoryUseScope::~MemoryUseScope() {
    t_use = saved_;
}

std::shared_ptr<MemoryAccount> current_memory_account() {
    return t_account;
}

MemoryUse current_memory_use() {
    return t_use;
}

}  // namespace ptool
