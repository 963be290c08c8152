// Collective accounting, as PyTorch's CommDebugMode reports it: per op, per mesh dim and per
// module (the scope the runner sets), the number of calls and the bytes of the logical tensor
// (the collective's row says which, comm/collective.h: all_reduce and broadcast: the tensor;
// all_gather: the gathered output; reduce_scatter and all_to_all: the input). Per rank; each rank
// owns one counter.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "comm/collective.h"

namespace ptool {

struct CommTotals {
    int64_t calls = 0;
    int64_t bytes = 0;
};

// Which of a module's collectives runs now, set by the parallel code around them, for layers
// that wrap a communicator (fault injection) to tell them apart; not counted separately.
enum class CommSiteKind {
    none,
    construction,     // DDP's broadcast of the state at construction
    buffers,          // DDP's broadcast of the buffers before each forward
    bucket,           // DDP's all_reduce of one gradient bucket (CommSite::bucket: which, per root)
    unshard,          // fully_shard's all_gather of a unit's parameters
    reduce_grads,     // fully_shard's reduce_scatter of a unit's gradients (HSDP: and their all_reduce)
    clip_grad_norm,   // clip_grad_norm's all_reduces of the squares
    loss_parallel,    // loss_parallel's all_reduces of the row maxima and sums
    tied_weights,     // a pipeline's weights tied across stages: their broadcast at construction and
                      // the all_reduce of their gradients
    zero_params,      // ZeRO's all_gather of a bucket's updated parameter shards (CommSite::bucket: which)
    context_grads,    // context parallel's all_reduce of a parameter's gradient over cp
    context_kv,       // context parallel's all_gather of an attention's keys and values (and their
                      // gradients' reduce_scatter)
    expert_dispatch,  // expert parallel: a moe layer's all_to_alls of its tokens to their experts' ranks
                      // and back (and of the token counts per expert)
    expert_grads,     // expert parallel: the all_reduce of an expert's gradients over its replicas
    expert_balance,   // a moe layer's all_reduce of its load-balancing loss's statistics over the ranks
                      // whose tokens differ
    loss_items,       // loss_normalization global_tokens: the all_reduce of the step's valid-target
                      // count over the ranks whose tokens differ
};

struct CommSite {
    CommSiteKind kind = CommSiteKind::none;
    int bucket = -1;  // kind bucket: the bucket's index among its replicate() root's, in reduction order
    CommSite() = default;
    CommSite(CommSiteKind k) : kind(k) {}  // implicit: a site is its kind, but for a bucket's index
    static CommSite of_bucket(int k) {
        CommSite s(CommSiteKind::bucket);
        s.bucket = k;
        return s;
    }
    static CommSite of_zero_params(int k) {
        CommSite s(CommSiteKind::zero_params);
        s.bucket = k;
        return s;
    }
    bool is(CommSiteKind k) const { return kind == k; }
};

class CommCounter {
public:
    void add(Collective op, const std::string& mesh_dim, int64_t bytes);
    void set_module(std::string fqn) { module_ = std::move(fqn); }
    const std::string& module() const { return module_; }
    // Which of a module's collectives runs now (CommSite), for layers that wrap a communicator.
    void set_site(CommSite site) { site_ = site; }
    const CommSite& site() const { return site_; }
    void reset() { by_key_.clear(); }
    // Verification's own gathers are not part of the plan's communication: they run paused.
    void set_paused(bool paused) { paused_ = paused; }
    bool paused() const { return paused_; }

    using Key = std::tuple<Collective, std::string, std::string>;  // op, mesh dim, module
    const std::map<Key, CommTotals>& entries() const { return by_key_; }
    std::map<Collective, CommTotals> by_op() const;  // summed over dims and modules
    CommTotals total() const;

private:
    std::string module_;
    CommSite site_;
    bool paused_ = false;
    std::map<Key, CommTotals> by_key_;
};

// A step's collectives per (op, mesh dim), summed over modules.
using CommByOpDim = std::map<std::pair<Collective, std::string>, CommTotals>;
CommByOpDim by_op_dim(const CommCounter& comm);
// What `after` counted beyond `before` (a counter read twice: the collectives between).
CommByOpDim comm_since(const CommByOpDim& before, const CommByOpDim& after);
// a + (b - a) * k per entry, calls and bytes truncated (an entry one side lacks counts 0 there):
// collectives that grow by one block's worth from a to b, k blocks on (the planner's samples).
CommByOpDim comm_extrapolated(const CommByOpDim& a, const CommByOpDim& b, double k);

// Sets a counter's module and site (either may be null/empty) for the scope.
class CommScope {
public:
    CommScope(CommCounter* c, const std::string& module, CommSite site = {})
        : c_(c), module_(c ? c->module() : ""), site_(c ? c->site() : CommSite{}) {
        if (c_) c_->set_module(module), c_->set_site(site);
    }
    ~CommScope() {
        if (c_) c_->set_module(module_), c_->set_site(site_);
    }
    CommScope(const CommScope&) = delete;
    CommScope& operator=(const CommScope&) = delete;

private:
    CommCounter* c_;
    std::string module_;
    CommSite site_;
};

// Pauses a counter (which may be null) for the scope: shape metadata and verification's own
// gathers are not the plan's communication.
class CountingPaused {
public:
    explicit CountingPaused(CommCounter* c) : c_(c), was_(c && c->paused()) {
        if (c_) c_->set_paused(true);
    }
    ~CountingPaused() {
        if (c_) c_->set_paused(was_);
    }
    CountingPaused(const CountingPaused&) = delete;
    CountingPaused& operator=(const CountingPaused&) = delete;

private:
    CommCounter* c_;
    bool was_;
};

}  // namespace ptool
