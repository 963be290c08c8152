#include "comm/p2p_board.h"

#include <chrono>
#include <exception>
#include <optional>

#include "comm/comm_threads.h"

namespace ptool {

std::string P2PBoard::waiting(int r) {
    std::lock_guard<std::mutex> lk(mu_);
    return waiting_[r];
}

// Leaving with an error: my unpaired posts come off the board, and a post a peer has paired is
// waited for until the peer's copy is done (the peer reads or writes its tensor until then).
void P2PBoard::abandon(std::unique_lock<std::mutex>& lk, int rank, std::deque<Post>& mine) {
    for (Post& p : mine) {
        if (p.matched) continue;
        const Channel ch = p.kind == P2POp::Kind::send ? Channel{rank, p.peer, static_cast<int>(p.desc.tag)}
                                                       : Channel{p.peer, rank, static_cast<int>(p.desc.tag)};
        auto& board = p.kind == P2POp::Kind::send ? sends_ : recvs_;
        auto it = board.find(ch);
        if (it == board.end()) continue;
        std::erase(it->second, &p);
        if (it->second.empty()) board.erase(it);
    }
    cv_.wait(lk, [&] {
        for (const Post& p : mine)
            if (p.matched && !p.done) return false;
        return true;
    });
    waiting_[rank].clear();
}

void P2PBoard::exchange(int rank, const std::vector<P2POp>& ops, const P2PWait& how) {
    if (ops.empty()) return;
    const auto world = [&](int r) { return (*how.world_ranks)[r]; };
    std::deque<Post> mine;  // stable addresses: the board points at them until they are done
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const P2POp& op : ops) {
            mine.push_back(Post{op.kind, op.peer, describe_p2p(*op.tensor, op.tag, op.kind), *op.tensor});
            if (op.kind == P2POp::Kind::send)
                sends_[{rank, op.peer, op.tag}].push_back(&mine.back());
            else
                recvs_[{op.peer, rank, op.tag}].push_back(&mine.back());
        }
        cv_.notify_all();
    }
    // declared before the lock: the core is taken again after the board is unlocked
    std::optional<CoreSlots::Yielded> yielded;
    std::unique_lock<std::mutex> lk(mu_);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(how.timeout_seconds);
    for (;;) {
        // Pair my receives with the sends posted for them. Only this rank pairs a channel it is the
        // destination of, in posting order, so the first unpaired recv of a channel is its queue's front.
        std::vector<std::pair<Post*, Post*>> pairs;  // (send, recv)
        for (Post& p : mine) {
            if (p.kind != P2POp::Kind::recv || p.matched) continue;
            const Channel ch{p.peer, rank, static_cast<int>(p.desc.tag)};
            auto s = sends_.find(ch);
            if (s == sends_.end()) continue;
            auto r = recvs_.find(ch);
            PTOOL_REQUIRE(r != recvs_.end() && r->second.front() == &p, "p2p board: recv queue out of order");
            Post* send = s->second.front();
            s->second.pop_front();
            r->second.pop_front();
            if (s->second.empty()) sends_.erase(s);
            if (r->second.empty()) recvs_.erase(r);
            send->matched = p.matched = true;
            pairs.emplace_back(send, &p);
        }
        for (auto [s, r] : pairs) {
            if (s->desc.same_tensor(r->desc)) continue;
            RuntimeError e = p2p_mismatch(world(rank), world(r->peer), r->desc, s->desc);
            how.abort->abort(e.what(), e.kind());  // first: a sender told of the failure reads this message
            for (auto [s2, r2] : pairs)
                s2->done = r2->done = s2->failed = r2->failed = true;  // nothing is copied
            cv_.notify_all();
            abandon(lk, rank, mine);
            throw e;
        }
        if (!pairs.empty()) {
            lk.unlock();  // the senders wait for `done`, so their tensors stay as they are
            std::exception_ptr error;
            try {
                for (auto [s, r] : pairs)
                    copy_bytes(r->tensor.raw(), r->tensor.device(), s->tensor.raw(), s->tensor.device(),
                               r->desc.nbytes());
            } catch (...) {  // a device error: the senders must not wait for copies that will not come
                error = std::current_exception();
            }
            lk.lock();
            for (auto [s, r] : pairs) s->done = r->done = true, s->failed = r->failed = error != nullptr;
            cv_.notify_all();
            if (error) {  // the rank's runner aborts the job with it; the senders stop on `failed`
                abandon(lk, rank, mine);
                std::rethrow_exception(error);
            }
        }
        const Post* pending = nullptr;
        bool failed = false;
        for (const Post& p : mine) {
            failed = failed || p.failed;
            if (!pending && !p.done) pending = &p;
        }
        if (!pending && !failed) {
            waiting_[rank].clear();
            return;
        }
        if (how.abort->aborted.load() || failed) {  // failed: the receiver of a send of mine aborted the job
            abandon(lk, rank, mine);
            std::lock_guard<std::mutex> al(how.abort->mu);
            throw AbortedError(how.abort->message, how.abort->kind);
        }
        waiting_[rank] = p2p_op_str(pending->kind, world(pending->peer), pending->desc);
        if (how.timeout_seconds > 0 && std::chrono::steady_clock::now() >= deadline) {
            // The failure is claimed before this rank leaves the board: a peer whose own deadline
            // passes in the same instant (in a p2p op or a collective) then finds this rank still
            // waiting here, or stops as aborted, instead of racing this message with one that
            // finds this rank already gone.
            std::optional<RuntimeError> e;
            try {
                std::string context = waiting_[pending->peer];
                if (!context.empty()) {
                    context = fmt::format("rank {} waits in {}", world(pending->peer), context);
                } else {  // the group's lock before the board's (lock order); this rank shows as waiting
                    lk.unlock();
                    context = how.peer_context(pending->peer);
                    lk.lock();
                }
                e.emplace(p2p_timeout(world(rank), pending->kind, world(pending->peer), pending->desc,
                                      how.timeout_seconds, context));
                how.abort->abort(e->what(), e->kind());
            } catch (...) {  // my posts come off the board whatever happens: a peer must not find them
                if (!lk.owns_lock()) lk.lock();
                abandon(lk, rank, mine);
                throw;
            }
            abandon(lk, rank, mine);
            throw *e;
        }
        if (!yielded && how.cores) {  // its core to a rank that computes while this one waits
            lk.unlock();
            yielded.emplace(how.cores);
            lk.lock();
            continue;
        }
        cv_.wait_for(lk, std::chrono::milliseconds(20));
    }
}

}  // namespace ptool
