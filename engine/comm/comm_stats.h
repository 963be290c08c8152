// Collective accounting, as PyTorch's CommDebugMode reports it: per op, per mesh dim and per
// module (the scope the runner sets), the number of calls and the bytes of the logical tensor
// (all_reduce and broadcast: the tensor; all_gather: the gathered output; reduce_scatter and
// all_to_all: the input). Per rank; each rank owns one counter.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace ptool {

struct CommTotals {
    int64_t calls = 0;
    int64_t bytes = 0;
};

class CommCounter {
public:
    void add(const std::string& op, const std::string& mesh_dim, int64_t bytes);
    void set_module(std::string fqn) { module_ = std::move(fqn); }
    const std::string& module() const { return module_; }
    // Which of a module's collectives runs now ("bucket 1"), for layers that wrap a communicator
    // (fault injection); not counted separately.
    void set_site(std::string site) { site_ = std::move(site); }
    const std::string& site() const { return site_; }
    void reset() { by_key_.clear(); }
    // Verification's own gathers are not part of the plan's communication: they run paused.
    void set_paused(bool paused) { paused_ = paused; }
    bool paused() const { return paused_; }

    using Key = std::tuple<std::string, std::string, std::string>;  // op, mesh dim, module
    const std::map<Key, CommTotals>& entries() const { return by_key_; }
    std::map<std::string, CommTotals> by_op() const;  // summed over dims and modules
    CommTotals total() const;

private:
    std::string module_, site_;
    bool paused_ = false;
    std::map<Key, CommTotals> by_key_;
};

// Sets a counter's module and site (either may be null/empty) for the scope.
class CommScope {
public:
    CommScope(CommCounter* c, const std::string& module, std::string site = "")
        : c_(c), module_(c ? c->module() : ""), site_(c ? c->site() : "") {
        if (c_) c_->set_module(module), c_->set_site(std::move(site));
    }
    ~CommScope() {
        if (c_) c_->set_module(module_), c_->set_site(site_);
    }
    CommScope(const CommScope&) = delete;
    CommScope& operator=(const CommScope&) = delete;

private:
    CommCounter* c_;
    std::string module_, site_;
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
