// The threads communicator's point-to-point: a rendezvous board shared by the rank threads of one
// group (cuda_local's too).
//
// A rank posts each op of a batch on the board (its tensor's address, dtype and shape) under
// its channel (source, destination, tag), then waits until all of its ops are done. Posts of a
// channel pair in posting order; the receiver pairs them, checks dtype and shape, copies the
// sender's bytes into its own tensor (on its own stream when they are device memory) and marks
// both done. So a send completes only when its recv was posted and the bytes have arrived (the
// rendezvous NCCL's ncclSend makes), and a batch whose ops wait on each other completes because
// everything is posted before anything waits. Waiting gives the rank's core back (CoreSlots),
// polls the job's abort flag and ends at the communicator's deadline, as a collective's barrier.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/p2p.h"

namespace ptool {

struct AbortState;
class CoreSlots;

// How one rank waits on the board: the job's abort flag, its deadline, the cores it gives back,
// and the names for messages.
struct P2PWait {
    AbortState* abort = nullptr;
    double timeout_seconds = 0;
    CoreSlots* cores = nullptr;                     // null: no slots to give back
    const std::vector<int>* world_ranks = nullptr;  // group rank -> world rank
    // What group rank `peer` is doing outside point-to-point ("rank 0 is in all_reduce#12 ..."),
    // for a timeout's message; called with the board unlocked.
    std::function<std::string(int peer)> peer_context;
};

class P2PBoard {
public:
    explicit P2PBoard(int n) : waiting_(n) {}

    // Posts group rank `rank`'s ops (checked by check_p2p_ops) and completes them all. Throws
    // RuntimeError on a dtype/shape mismatch or a timeout (and aborts the job), AbortedError when
    // another rank failed. A tensor on the device must be complete (its stream synchronised).
    void exchange(int rank, const std::vector<P2POp>& ops, const P2PWait& how);

    // The op rank r waits in ("recv from rank 0 (tag 7, float32 [4, 8])"), or "" when none.
    std::string waiting(int r);

private:
    struct Post {
        P2POp::Kind kind;
        int peer;  // group rank
        P2PDesc desc;
        Tensor tensor;
        bool matched = false, done = false;
        bool failed = false;  // paired with a post of another dtype or shape: nothing was copied
    };
    using Channel = std::tuple<int, int, int>;  // source, destination, tag
    void abandon(std::unique_lock<std::mutex>& lk, int rank, std::deque<Post>& mine);

    std::mutex mu_;
    std::condition_variable cv_;
    std::map<Channel, std::deque<Post*>> sends_, recvs_;  // posted and not yet paired, in posting order
    std::vector<std::string> waiting_;                    // per group rank: the op it waits in
};

}  // namespace ptool
