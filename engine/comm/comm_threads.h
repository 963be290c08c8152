// The threads communicator: N rank threads in one process, collectives through shared memory.
//
// A collective is two barriers: ranks post their buffers, pass barrier A, each computes its own
// part by reading the others' buffers (reductions in rank order), and pass barrier B before any
// buffer may change. all_reduce is one pass: rank r reduces chunk r of every rank's tensor and
// stores the result into chunk r of every rank's tensor.
//
// Barriers wait with a deadline and poll a job-wide abort flag, so a rank that throws or never
// arrives ends every rank of every group within the timeout, with one message naming the rank,
// the collective and what every rank of the group was doing.
//
// Point-to-point goes through the group's rendezvous board (comm/p2p_board.h): the receiver copies
// the sender's bytes once both have posted; waits poll the same abort flag and deadline.
//
// cuda_local is this communicator over device memory (docs/architecture.md, GPUs: N virtual ranks on one GPU,
// one stream per rank thread): a collective on cuda tensors waits for the rank's own stream
// before posting its buffers (they are complete when others read them), moves data with device
// copies and reduces with a kernel in rank order (comm/device_reduce.h), and waits for its
// stream again before the closing barrier. Host tensors in the same job (BatchNorm's per-channel
// statistics) still take the host path.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "comm/communicator.h"
#include "comm/p2p_board.h"
#include "core/turns.h"

namespace ptool {

// Shared by every group of one job: the first failure, and whether the job is aborting.
struct AbortState {
    std::atomic<bool> aborted{false};
    std::mutex mu;
    std::string message;
    RuntimeError::Kind kind = RuntimeError::Kind::other;              // the first failure's
    void abort(const std::string& why, RuntimeError::Kind why_kind);  // keeps the first message
};

// Thrown on ranks that stop because another rank failed (not the root cause); carries the root
// cause's message and kind.
class AbortedError : public RuntimeError {
public:
    using RuntimeError::RuntimeError;
};

// The cores a job's rank threads take turns on, when there are more CPU ranks than cores: a rank
// holds a core while it computes and gives it back while it waits in a collective. Eight tp ranks
// on two cores then run two at a time, each GEMM with a core's caches to itself, instead of being
// time-sliced by the kernel mid-GEMM (gemm_mlp's tp=8 step ran at 42-56% of the sgemm rate).
// Nothing changes in what a rank computes or in which order the collectives see ranks. Cores go to
// waiting threads first come, first served, and a rank thread that computes for long takes turns
// with the waiting ones (core/turns.h).
class CoreSlots final : public TurnTaker {
public:
    explicit CoreSlots(int cores) : free_(cores) {}
    void acquire();
    void release();
    void take_turn() override;  // the core to the longest waiting thread, this one queued behind
    // A rank's core for the scope (null: no limit); the thread takes turns on them meanwhile
    struct Held {
        CoreSlots* slots;
        explicit Held(CoreSlots* s) : slots(s) {
            if (slots) slots->acquire(), set_thread_turns(slots);
        }
        ~Held() {
            if (slots) set_thread_turns(nullptr), slots->release();
        }
        Held(const Held&) = delete;
        Held& operator=(const Held&) = delete;
    };
    // Given back for the scope (a rank waiting at a barrier), taken again at its end
    struct Yielded {
        CoreSlots* slots;
        explicit Yielded(CoreSlots* s) : slots(s) {
            if (slots) slots->release();
        }
        ~Yielded() {
            if (slots) slots->acquire();
        }
        Yielded(const Yielded&) = delete;
        Yielded& operator=(const Yielded&) = delete;
    };

private:
    struct Waiter {
        std::condition_variable cv;
        bool granted = false;
    };
    void grant_front();  // mu_ held, a waiter queued: the core goes to the longest waiting
    std::mutex mu_;
    std::deque<Waiter*> waiting_;
    int free_;
};

struct ThreadGroup {
    ThreadGroup(int n, std::shared_ptr<AbortState> abort, std::vector<int> world_ranks);
    const int n;
    std::shared_ptr<AbortState> abort;
    std::vector<int> world_ranks;  // member i's rank in the job, for messages
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;
    std::vector<const void*> in;
    std::vector<void*> out;
    std::vector<int64_t> count;  // per-rank dim-0 size (all_gather) or element count
    std::vector<const std::vector<int64_t>*> send_rows, recv_rows;  // per rank (all_to_all_v)
    std::vector<CollectiveDesc> desc;             // what each rank is in, for checks and timeout messages
    std::vector<bool> inside;                     // rank is inside a collective of this group now
    std::vector<bool> posted;                     // rank has entered at least one collective
    std::vector<std::pair<int, int>> split_args;  // (color, key) per rank
    std::map<std::pair<int64_t, int>, std::shared_ptr<ThreadGroup>> splits;
    std::shared_ptr<CoreSlots> cores;  // the job's (its splits share it); null: as many cores as ranks
    P2PBoard p2p;                      // point-to-point between the group's ranks
};

class ThreadsCommunicator final : public Communicator {
public:
    ThreadsCommunicator(std::shared_ptr<ThreadGroup> group, int rank, CommOptions options,
                        Device device = Device::cpu)
        : group_(std::move(group)), rank_(rank), options_(options), device_(device) {}

    int rank() const override { return rank_; }
    int size() const override { return group_->n; }
    std::string backend() const override { return device_ == Device::cpu ? "threads" : "cuda_local"; }

    void all_reduce(Tensor& t, ReduceOp op) override;
    void all_gather(const Tensor& in, Tensor& out) override;
    void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
    void broadcast(Tensor& t, int root) override;
    void all_to_all(const Tensor& in, Tensor& out) override;
    void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                      const std::vector<int64_t>& recv_rows) override;
    void barrier() override;
    std::unique_ptr<Communicator> split(int color, int key) override;
    void batch_isend_irecv(const std::vector<P2POp>& ops) override;

private:
    // Posts this rank's buffers and descriptor, waits for all, checks consistency.
    void enter(const CollectiveDesc& d, const void* in, void* out, int64_t count,
               Device device = Device::cpu);
    // Barrier with a deadline; abortable: it also gives up when any rank of the world aborted.
    void sync(bool abortable = true);
    void leave(Device device = Device::cpu);
    // Data movement on the tensors' device: host memcpy / rank-order reduction, or their device forms
    // (device copies are queued on the rank's stream: leave() waits for them).
    static void copy(void* dst, const void* src, size_t bytes, Device device);
    static void reduce(const std::vector<const void*>& ins, const std::vector<void*>& outs, int64_t count,
                       DType dtype, ReduceOp op, Device device);
    [[noreturn]] void timeout();

    std::shared_ptr<ThreadGroup> group_;
    int rank_;
    CommOptions options_;
    Device device_;  // the memory the job's tensors live in: names the backend
    int64_t sequence_ = 0;
};

// Runs fn(*make_comm(r)) on n threads, r = 0..n-1; a rank that throws aborts the job (abort) and
// the root-cause failure is rethrown after every thread has ended: an InputError as itself, any
// other as RuntimeError naming the rank. Shared by the threads, cuda_local and nccl runners.
void run_threads(int n, const std::shared_ptr<AbortState>& abort,
                 const std::function<std::unique_ptr<Communicator>(int rank)>& make_comm,
                 const std::function<void(Communicator&)>& fn);

// Runs fn(comm) on n rank threads; rethrows the root-cause failure (RuntimeError naming the rank)
// after every thread has ended. device cuda: the communicators are cuda_local. `cores`: the slots
// the ranks take turns on (shared with another job's ranks); null: the machine's cores when there
// are more CPU ranks than cores, else none.
void run_rank_threads(int n, const CommOptions& options, const std::function<void(Communicator&)>& fn,
                      Device device = Device::cpu, std::shared_ptr<CoreSlots> cores = nullptr);

}  // namespace ptool
