#include "comm/comm_threads.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

#include "comm/device_reduce.h"
#include "core/cores.h"

namespace ptool {

void AbortState::abort(const std::string& why, RuntimeError::Kind why_kind) {
    std::lock_guard<std::mutex> lk(mu);
    if (!aborted.load()) message = why, kind = why_kind;
    aborted.store(true);
}

void CoreSlots::acquire() {
    std::unique_lock<std::mutex> lk(mu_);
    if (free_ > 0 && waiting_.empty()) {
        --free_;
    } else {
        Waiter me;
        waiting_.push_back(&me);
        me.cv.wait(lk, [&] { return me.granted; });
    }
    turn_started();
}

void CoreSlots::grant_front() {
    Waiter* w = waiting_.front();
    waiting_.pop_front();
    w->granted = true;
    w->cv.notify_one();  // under the lock: the waiter returns (and its cv goes) only after it is released
}

void CoreSlots::release() {
    std::lock_guard<std::mutex> lk(mu_);
    if (waiting_.empty())
        ++free_;
    else
        grant_front();
}

void CoreSlots::take_turn() {
    std::unique_lock<std::mutex> lk(mu_);
    if (waiting_.empty()) return turn_started();
    grant_front();
    Waiter me;
    waiting_.push_back(&me);
    me.cv.wait(lk, [&] { return me.granted; });
    turn_started();
}

ThreadGroup::ThreadGroup(int n_, std::shared_ptr<AbortState> abort_, std::vector<int> world_ranks_)
    : n(n_),
      abort(std::move(abort_)),
      world_ranks(std::move(world_ranks_)),
      in(n_),
      out(n_),
      count(n_),
      send_rows(n_),
      recv_rows(n_),
      desc(n_),
      inside(n_, false),
      posted(n_, false),
      split_args(n_),
      p2p(n_) {}

void ThreadsCommunicator::sync(bool abortable) {
    ThreadGroup& g = *group_;
    uint64_t gen = 0;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        gen = g.generation;
        if (++g.arrived == g.n) {
            g.arrived = 0;
            ++g.generation;
            g.cv.notify_all();
            return;
        }
    }
    // its core to a rank that computes until the others arrive, taken back after the group's lock
    // is released (declared first, destroyed last)
    const CoreSlots::Yielded waiting(g.cores.get());
    std::unique_lock<std::mutex> lk(g.mu);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout_seconds);
    while (g.generation == gen) {
        if (abortable && g.abort->aborted.load()) {
            --g.arrived;
            std::lock_guard<std::mutex> al(g.abort->mu);
            throw AbortedError(g.abort->message, g.abort->kind);
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            --g.arrived;
            lk.unlock();
            timeout();
        }
        g.cv.wait_for(lk, std::chrono::milliseconds(20));
    }
}

void ThreadsCommunicator::timeout() {
    ThreadGroup& g = *group_;
    std::string waiting;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        for (int r = 0; r < g.n; ++r) {
            const std::string p2p = g.inside[r] ? "" : g.p2p.waiting(r);  // lock order: group, then board
            waiting += fmt::format("; rank {} {}", g.world_ranks[r],
                                   g.inside[r]    ? "waits in " + g.desc[r].str()
                                   : !p2p.empty() ? "waits in " + p2p
                                   : g.posted[r]  ? "never arrived (last: " + g.desc[r].str() + ")"
                                                  : "never arrived (no collective yet)");
        }
    }
    const std::string msg = fmt::format("rank {} timed out after {} s in {}{}", g.world_ranks[rank_],
                                        options_.timeout_seconds, g.desc[rank_].str(), waiting);
    g.abort->abort(msg, RuntimeError::Kind::timeout);
    throw RuntimeError(msg, RuntimeError::Kind::timeout);
}

void ThreadsCommunicator::copy(void* dst, const void* src, size_t bytes, Device device) {
    if (bytes == 0 || dst == src) return;
    if (device == Device::cpu)
        std::memcpy(dst, src, bytes);
    else
        device_memory().copy_device_async(dst, src, bytes);  // leave() waits for the rank's stream
}

void ThreadsCommunicator::reduce(const std::vector<const void*>& ins, const std::vector<void*>& outs,
                                 int64_t count, DType dtype, ReduceOp op, Device device) {
    if (count <= 0) return;
    if (device == Device::cpu)
        reduce_in_rank_order(ins, outs, count, dtype, op);
    else
        device_reduce_in_rank_order(ins, outs, count, dtype, op);
}

void ThreadsCommunicator::enter(const CollectiveDesc& d, const void* in, void* out, int64_t count,
                                Device device) {
    ThreadGroup& g = *group_;
    if (device != Device::cpu)
        device_memory().synchronize();  // this rank's buffers are complete before others read
    {
        std::lock_guard<std::mutex> lk(g.mu);
        g.in[rank_] = in, g.out[rank_] = out, g.count[rank_] = count, g.desc[rank_] = d,
        g.inside[rank_] = true;
        g.posted[rank_] = true;
    }
    sync();
    // Every rank runs the same comparison on the same posted descriptors, so all agree on the verdict.
    for (int r = 0; r < g.n; ++r) {
        CollectiveDesc mine = g.desc[rank_], theirs = g.desc[r];
        if (!options_.check_consistency)
            mine.sequence = theirs.sequence = 0;  // shapes and dtypes still guard memory
        if (!theirs.matches(mine)) {
            const int lo = std::min(rank_, r), hi = std::max(rank_, r);
            const std::string msg =
                fmt::format("collective mismatch: rank {} {} vs rank {} {}", g.world_ranks[hi],
                            g.desc[hi].str(), g.world_ranks[lo], g.desc[lo].str());
            g.abort->abort(msg, RuntimeError::Kind::mismatch);
            throw RuntimeError(msg, RuntimeError::Kind::mismatch);
        }
    }
}

void ThreadsCommunicator::leave(Device device) {
    if (device != Device::cpu)
        device_memory().synchronize();  // this rank's writes land before anyone goes on
    // Not abortable: the others may still read this rank's buffers, and they do not block between
    // enter and leave, so they arrive (a rank that left on another group's abort freed the tensor
    // a peer was reducing: heap-use-after-free under ASan). The next collective sees the abort.
    sync(false);
    std::lock_guard<std::mutex> lk(group_->mu);
    group_->inside[rank_] = false;
}

// One pass: rank r reduces chunk r of every rank's tensor and stores it into chunk r of every
// rank's tensor. Only rank r touches chunk r of any buffer, so this is race-free in place; each
// rank reads and writes n * (size / n) bytes, the least a shared-memory all_reduce can move.
void ThreadsCommunicator::all_reduce(Tensor& t, ReduceOp op) {
    count(Collective::all_reduce, static_cast<int64_t>(t.nbytes()));
    const int64_t n = t.numel();
    const size_t es = dtype_size(t.dtype());
    ThreadGroup& g = *group_;
    enter(describe(Collective::all_reduce, t, sequence_++), t.raw(), t.raw(), n, t.device());
    const Chunk c = chunk_of(n, g.n, rank_);
    std::vector<const void*> ins(g.n);
    std::vector<void*> outs(g.n);
    for (int r = 0; r < g.n; ++r) {
        ins[r] = static_cast<const char*>(g.in[r]) + c.offset * es;
        outs[r] = static_cast<char*>(g.out[r]) + c.offset * es;
    }
    reduce(ins, outs, c.length, t.dtype(), op, t.device());
    leave(t.device());
}

void ThreadsCommunicator::all_gather(const Tensor& in, Tensor& out) {
    count(Collective::all_gather, static_cast<int64_t>(out.nbytes()));
    ThreadGroup& g = *group_;
    PTOOL_REQUIRE(in.device() == out.device(), "all_gather: input on {}, output on {}",
                  device_name(in.device()), device_name(out.device()));
    enter(describe(Collective::all_gather, in, sequence_++, -1, true), in.raw(), out.raw(),
          in.dim() ? in.size(0) : 1, in.device());
    const int64_t row = row_numel(in);
    const size_t row_bytes = static_cast<size_t>(row) * dtype_size(in.dtype());
    int64_t total = 0;
    for (int r = 0; r < g.n; ++r) total += g.count[r];
    PTOOL_REQUIRE(out.numel() == total * row, "all_gather: output {} cannot hold {} rows of {}",
                  shape_str(out.shape()), total, row);
    char* dst = static_cast<char*>(out.raw());
    for (int r = 0; r < g.n; ++r) {
        copy(dst, g.in[r], g.count[r] * row_bytes, in.device());  // in place (dst == in): already there
        dst += g.count[r] * row_bytes;
    }
    leave(in.device());
}

void ThreadsCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
    count(Collective::reduce_scatter, static_cast<int64_t>(in.nbytes()));
    ThreadGroup& g = *group_;
    PTOOL_REQUIRE(in.device() == out.device(), "reduce_scatter: input on {}, output on {}",
                  device_name(in.device()), device_name(out.device()));
    enter(describe(Collective::reduce_scatter, in, sequence_++), in.raw(), out.raw(), in.numel(),
          in.device());
    const auto [rows, row, c] = reduce_scatter_rows(in, out, g.n, rank_);
    const size_t es = dtype_size(in.dtype());
    std::vector<const void*> ins(g.n);
    for (int r = 0; r < g.n; ++r) ins[r] = static_cast<const char*>(g.in[r]) + c.offset * row * es;
    reduce(ins, {out.raw()}, c.length * row, in.dtype(), op, in.device());
    leave(in.device());
}

void ThreadsCommunicator::broadcast(Tensor& t, int root) {
    count(Collective::broadcast, static_cast<int64_t>(t.nbytes()));
    PTOOL_REQUIRE(root >= 0 && root < size(), "broadcast root {} outside [0, {})", root, size());
    enter(describe(Collective::broadcast, t, sequence_++, root), t.raw(), t.raw(), t.numel(), t.device());
    if (rank_ != root) copy(t.raw(), group_->in[root], t.nbytes(), t.device());
    leave(t.device());
}

void ThreadsCommunicator::all_to_all(const Tensor& in, Tensor& out) {
    count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    ThreadGroup& g = *group_;
    PTOOL_REQUIRE(in.numel() % g.n == 0 && out.numel() == in.numel(), "all_to_all: {} elements over {} ranks",
                  in.numel(), g.n);
    PTOOL_REQUIRE(in.device() == out.device(), "all_to_all: input on {}, output on {}",
                  device_name(in.device()), device_name(out.device()));
    enter(describe(Collective::all_to_all, in, sequence_++), in.raw(), out.raw(), in.numel(), in.device());
    const size_t chunk = in.nbytes() / g.n;
    for (int r = 0; r < g.n; ++r)
        copy(static_cast<char*>(out.raw()) + r * chunk, static_cast<const char*>(g.in[r]) + rank_ * chunk,
             chunk, in.device());
    leave(in.device());
}

void ThreadsCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                                       const std::vector<int64_t>& recv_rows) {
    count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    ThreadGroup& g = *group_;
    check_all_to_all_v(in, send_rows, out, recv_rows, g.n);
    {  // read by the others only between enter's and leave's barriers
        std::lock_guard<std::mutex> lk(g.mu);
        g.send_rows[rank_] = &send_rows, g.recv_rows[rank_] = &recv_rows;
    }
    enter(describe("all_to_all_v", in, sequence_++, -1, true), in.raw(), out.raw(), in.numel(), in.device());
    std::vector<std::vector<int64_t>> sends(g.n), recvs(g.n);
    {
        std::lock_guard<std::mutex> lk(g.mu);
        for (int r = 0; r < g.n; ++r) sends[r] = *g.send_rows[r], recvs[r] = *g.recv_rows[r];
    }
    sync();  // every rank has read the others' splits before any returns (or throws) and frees its own
    const std::string bad = all_to_all_v_mismatch(sends, recvs, [&](int r) { return g.world_ranks[r]; });
    if (!bad.empty()) {  // every rank found the same pair
        g.abort->abort(bad, RuntimeError::Kind::mismatch);
        throw RuntimeError(bad, RuntimeError::Kind::mismatch);
    }
    const size_t row = static_cast<size_t>(row_numel(in)) * dtype_size(in.dtype());
    char* dst = static_cast<char*>(out.raw());
    for (int r = 0; r < g.n; ++r) {  // rank r's rows for this rank sit after those it sends to lower ranks
        int64_t before = 0;
        for (int j = 0; j < rank_; ++j) before += sends[r][j];
        copy(dst, static_cast<const char*>(g.in[r]) + before * row, sends[r][rank_] * row, in.device());
        dst += sends[r][rank_] * row;
    }
    leave(in.device());
}

void ThreadsCommunicator::barrier() {
    const CollectiveDesc d = describe("barrier", sequence_++);
    enter(d, nullptr, nullptr, 0);
    leave();
}

std::unique_ptr<Communicator> ThreadsCommunicator::split(int color, int key) {
    ThreadGroup& g = *group_;
    const CollectiveDesc d = describe("split", sequence_++);
    {
        std::lock_guard<std::mutex> lk(g.mu);
        g.split_args[rank_] = {color, key};
    }
    enter(d, nullptr, nullptr, 0);
    std::vector<std::pair<int, int>> members;  // (key, parent rank) of my color
    for (int r = 0; r < g.n; ++r)
        if (g.split_args[r].first == color) members.push_back({g.split_args[r].second, r});
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    std::vector<int> world;
    for (size_t i = 0; i < members.size(); ++i) {
        if (members[i].second == rank_) new_rank = static_cast<int>(i);
        world.push_back(g.world_ranks[members[i].second]);
    }
    std::shared_ptr<ThreadGroup> sub;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        auto& slot = g.splits[{d.sequence, color}];
        if (!slot) {
            slot = std::make_shared<ThreadGroup>(static_cast<int>(members.size()), g.abort, world);
            slot->cores = g.cores;  // the job's cores: a sub-group's waits give them back too
        }
        sub = slot;
    }
    leave();
    auto comm = std::make_unique<ThreadsCommunicator>(sub, new_rank, options_, device_);
    return comm;
}

void ThreadsCommunicator::batch_isend_irecv(const std::vector<P2POp>& ops) {
    ThreadGroup& g = *group_;
    check_p2p_ops(ops, rank_, g.n, [&](int r) { return g.world_ranks[r]; });
    count_p2p(ops);
    for (const P2POp& op : ops)
        if (op.kind == P2POp::Kind::send && op.tensor->device() == Device::cuda) {
            device_memory().synchronize();  // what this rank sends is complete before the receiver copies it
            break;
        }
    P2PWait how;
    how.abort = g.abort.get();
    how.timeout_seconds = options_.timeout_seconds;
    how.cores = g.cores.get();
    how.world_ranks = &g.world_ranks;
    how.peer_context = [&g](int peer) {
        std::lock_guard<std::mutex> lk(g.mu);
        const int w = g.world_ranks[peer];
        if (g.inside[peer]) return fmt::format("rank {} is in {}", w, g.desc[peer].str());
        if (g.posted[peer])
            return fmt::format("rank {} is in no collective or point-to-point op of this group (last: {})", w,
                               g.desc[peer].str());
        return fmt::format("rank {} is in no collective or point-to-point op of this group", w);
    };
    g.p2p.exchange(rank_, ops, how);
}

void run_threads(int n, const std::shared_ptr<AbortState>& abort,
                 const std::function<std::unique_ptr<Communicator>(int rank)>& make_comm,
                 const std::function<void(Communicator&)>& fn) {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(n);
    for (int r = 0; r < n; ++r) {
        auto rank = [&, r] {
            std::unique_ptr<Communicator> comm;  // outlives the catch: ended after the job knows of a failure
            try {
                comm = make_comm(r);
                fn(*comm);
            } catch (const AbortedError&) {
                // another rank failed first; its message is the one reported
            } catch (const std::bad_alloc&) {
                abort->abort(fmt::format("rank {} ran out of memory (an allocation failed)", r),
                             RuntimeError::Kind::rank_failed);
                errors[r] = std::current_exception();
            } catch (const RuntimeError& e) {
                if (e.names_rank())
                    abort->abort(e.what(), e.kind());
                else
                    abort->abort(fmt::format("rank {} failed: {}", r, e.what()),
                                 RuntimeError::Kind::rank_failed);
                errors[r] = std::current_exception();
            } catch (const std::exception& e) {
                abort->abort(fmt::format("rank {} failed: {}", r, e.what()), RuntimeError::Kind::rank_failed);
                errors[r] = std::current_exception();
            }
        };
        try {
            threads.emplace_back(rank);
        } catch (const std::system_error& e) {  // the ranks already started stop at their next collective
            abort->abort(
                fmt::format(
                    "cannot start rank {} of {} as a thread: {} (a resource ran out: threads or memory)", r,
                    n, e.what()),
                RuntimeError::Kind::other);
            break;
        }
    }
    for (auto& t : threads) t.join();
    if (abort->aborted.load()) {
        for (const auto& e : errors) {  // an input error on a rank is still an input error (exit 2)
            if (!e) continue;
            try {
                std::rethrow_exception(e);
            } catch (const InputError&) {
                throw;
            } catch (const ScheduleViolation&) {  // every rank's: verify's verdict (core/error.h)
                throw;
            } catch (...) {
            }
        }
        throw RuntimeError(abort->message, abort->kind);
    }
}

void run_rank_threads(int n, const CommOptions& options, const std::function<void(Communicator&)>& fn,
                      Device device, std::shared_ptr<CoreSlots> cores) {
    std::vector<int> world(n);
    for (int r = 0; r < n; ++r) world[r] = r;
    auto abort = std::make_shared<AbortState>();
    auto group = std::make_shared<ThreadGroup>(n, abort, world);
    const int hardware = usable_cores();
    if (cores)
        group->cores = std::move(cores);
    else if (device == Device::cpu && hardware > 0 && n > hardware)
        group->cores = std::make_shared<CoreSlots>(hardware);
    run_threads(
        n, abort, [&](int r) { return std::make_unique<ThreadsCommunicator>(group, r, options, device); },
        [&](Communicator& comm) {
            const CoreSlots::Held core(group->cores.get());
            fn(comm);
        });
}

}  // namespace ptool
