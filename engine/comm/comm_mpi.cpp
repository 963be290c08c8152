#include "comm/comm_mpi.h"

#include <chrono>
#include <climits>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "comm/p2p.h"
#include "comm/rank_supervisor.h"
#include "core/check.h"

namespace ptool {
namespace {

int as_int(size_t n, const char* what) {
    if (n > static_cast<size_t>(INT_MAX))
        throw RuntimeError(fmt::format("{}: {} bytes exceed MPI's int count", what, n));
    return static_cast<int>(n);
}

}  // namespace

// One op of a batch in flight. A recv moves from its descriptor (stage header) to its bytes
// (stage payload) to done; a send posts both at once and is done when both completed.
struct MpiP2P {
    enum class Stage { header, payload, done };
    P2POp::Kind kind = P2POp::Kind::send;
    int peer = 0;
    Tensor tensor;         // shares the op's storage (kept alive with the op if it is given up)
    P2PDesc desc, theirs;  // this rank's; the sender's (recv)
    MPI_Request header = MPI_REQUEST_NULL, payload = MPI_REQUEST_NULL;
    std::vector<char> scratch;  // a mismatched message's bytes, drained so its sender completes
    Stage stage = Stage::header;
};

namespace {

// Ops given up (a timeout, a mismatch): a receive still waiting for its descriptor is cancelled;
// sends cannot be, and a receive whose descriptor matched (its bytes posted, or a mismatched
// message's drain) is left to complete: its sender's synchronous send completes only when it is
// received (cancelled before the bytes arrived, the sender waited out its whole timeout:
// mpi_conformance_np3's 'dtype mismatch' under load, 2026-11-30). MPI may complete any of them
// after the batch has thrown: their buffers (descriptors, tensors, scratch) stay reachable here
// until the process ends; failures end it soon anyway.
void keep_until_exit(std::shared_ptr<std::vector<MpiP2P>> batch) {
    static std::mutex mu;
    static auto* kept =
        new std::vector<std::shared_ptr<std::vector<MpiP2P>>>;  // never destroyed: MPI may write late
    std::lock_guard<std::mutex> lk(mu);
    kept->push_back(std::move(batch));
}

void give_up(const std::shared_ptr<std::vector<MpiP2P>>& batch) {
    for (MpiP2P& m : *batch)
        for (MPI_Request* req : {&m.header, &m.payload}) {
            if (*req == MPI_REQUEST_NULL) continue;
            if (m.kind == P2POp::Kind::recv && req == &m.header) MPI_Cancel(req);
            MPI_Request_free(req);
        }
    keep_until_exit(batch);
}

}  // namespace

std::string mpi_error_string(int code) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
    return std::string(msg, len);
}

bool launched_by_mpi() {
    // OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMI/PMIx launchers (srun) set PMI_SIZE or PMIX_RANK
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

void mpi_init_once() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    PTOOL_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    });
}

int mpi_world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

void mpi_abort_job(const std::string& message, int code) {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options) : options_(options) {
    PTOOL_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Group group, world;
    PTOOL_CHECK_MPI(MPI_Comm_group(comm_, &group));
    PTOOL_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> mine(size_);
    std::iota(mine.begin(), mine.end(), 0);
    world_ranks_.resize(size_);
    PTOOL_CHECK_MPI(MPI_Group_translate_ranks(group, size_, mine.data(), world, world_ranks_.data()));
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    int* ub = nullptr;
    int found = 0;
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found) == MPI_SUCCESS && found && ub)
        tag_ub_ = *ub;
}

MpiCommunicator::~MpiCommunicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::wait(MPI_Request& req, const CollectiveDesc& d) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout_seconds);
    int done = 0;
    set_rank_activity("in " + d.str());
    for (int spins = 0;; ++spins) {
        PTOOL_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) {
            set_rank_activity("after " + d.str());
            return;
        }
        if (options_.timeout_seconds > 0 && std::chrono::steady_clock::now() >= deadline)
            mpi_abort_job(
                fmt::format("rank {} timed out after {} s in {} (a rank never arrived, or is in another "
                            "collective)",
                            mpi_world_rank(), options_.timeout_seconds, d.str()),
                3);
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

void MpiCommunicator::check(const CollectiveDesc& d) {
    if (!options_.check_consistency) return;
    std::vector<CollectiveDesc> all(size_);
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Iallgather(&d, sizeof d, MPI_BYTE, all.data(), sizeof d, MPI_BYTE, comm_, &req));
    wait(req, d);
    for (int r = 0; r < size_; ++r) {
        if (all[r].matches(d)) continue;
        const int lo = std::min(rank_, r), hi = std::max(rank_, r);
        throw RuntimeError(fmt::format("collective mismatch: rank {} {} vs rank {} {}", hi, all[hi].str(), lo,
                                       all[lo].str()),
                           RuntimeError::Kind::mismatch);
    }
}

void MpiCommunicator::reduce_chunk(const Tensor& in, void* out, int64_t rows, int64_t row, ReduceOp op,
                                   const CollectiveDesc& d) {
    // all-to-all: chunk j of every rank's tensor goes to rank j, which reduces in rank order
    const size_t es = dtype_size(in.dtype());
    std::vector<int> send_counts(size_), send_displs(size_), recv_counts(size_), recv_displs(size_);
    const Chunk mine = chunk_of(rows, size_, rank_);
    for (int j = 0; j < size_; ++j) {
        const Chunk c = chunk_of(rows, size_, j);
        send_counts[j] = as_int(c.length * row * es, "reduce");
        send_displs[j] = as_int(c.offset * row * es, "reduce");
        recv_counts[j] = as_int(mine.length * row * es, "reduce");
        recv_displs[j] = as_int(j * mine.length * row * es, "reduce");
    }
    std::vector<char> recv(static_cast<size_t>(size_) * mine.length * row * es);
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Ialltoallv(in.raw(), send_counts.data(), send_displs.data(), MPI_BYTE, recv.data(),
                                   recv_counts.data(), recv_displs.data(), MPI_BYTE, comm_, &req));
    wait(req, d);
    std::vector<const void*> ins(size_);
    for (int j = 0; j < size_; ++j) ins[j] = recv.data() + recv_displs[j];
    if (mine.length * row > 0) reduce_in_rank_order(ins, {out}, mine.length * row, in.dtype(), op);
}

void MpiCommunicator::all_reduce(Tensor& t, ReduceOp op) {
    count(Collective::all_reduce, static_cast<int64_t>(t.nbytes()));
    const CollectiveDesc d = describe(Collective::all_reduce, t, sequence_++);
    check(d);
    const int64_t n = t.numel();
    const size_t es = dtype_size(t.dtype());
    const Chunk mine = chunk_of(n, size_, rank_);
    std::vector<char> part(mine.length * es);
    reduce_chunk(t.reshape({n}), part.data(), n, 1, op, d);
    std::vector<int> counts(size_), displs(size_);
    for (int j = 0; j < size_; ++j) {
        const Chunk c = chunk_of(n, size_, j);
        counts[j] = as_int(c.length * es, collective_name(Collective::all_reduce)),
        displs[j] = as_int(c.offset * es, collective_name(Collective::all_reduce));
    }
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Iallgatherv(part.data(), counts[rank_], MPI_BYTE, t.raw(), counts.data(),
                                    displs.data(), MPI_BYTE, comm_, &req));
    wait(req, d);
}

void MpiCommunicator::all_gather(const Tensor& in, Tensor& out) {
    count(Collective::all_gather, static_cast<int64_t>(out.nbytes()));
    const CollectiveDesc d = describe(Collective::all_gather, in, sequence_++, -1, true);
    check(d);
    int64_t mine = static_cast<int64_t>(in.nbytes());
    std::vector<int64_t> sizes(size_);
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm_, &req));
    wait(req, d);
    std::vector<int> counts(size_), displs(size_);
    int64_t total = 0;
    for (int j = 0; j < size_; ++j) {
        counts[j] = as_int(sizes[j], collective_name(Collective::all_gather)),
        displs[j] = as_int(total, collective_name(Collective::all_gather));
        total += sizes[j];
    }
    PTOOL_REQUIRE(total == static_cast<int64_t>(out.nbytes()),
                  "all_gather: output {} holds {} bytes, ranks sent {}", shape_str(out.shape()), out.nbytes(),
                  total);
    PTOOL_CHECK_MPI(MPI_Iallgatherv(in.raw(), counts[rank_], MPI_BYTE, out.raw(), counts.data(),
                                    displs.data(), MPI_BYTE, comm_, &req));
    wait(req, d);
}

void MpiCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
    count(Collective::reduce_scatter, static_cast<int64_t>(in.nbytes()));
    const CollectiveDesc d = describe(Collective::reduce_scatter, in, sequence_++);
    check(d);
    const RowChunk rc = reduce_scatter_rows(in, out, size_, rank_);
    reduce_chunk(in, out.raw(), rc.rows, rc.row, op, d);
}

void MpiCommunicator::broadcast(Tensor& t, int root) {
    count(Collective::broadcast, static_cast<int64_t>(t.nbytes()));
    const CollectiveDesc d = describe(Collective::broadcast, t, sequence_++, root);
    check(d);
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Ibcast(t.raw(), as_int(t.nbytes(), collective_name(Collective::broadcast)), MPI_BYTE,
                               root, comm_, &req));
    wait(req, d);
}

void MpiCommunicator::all_to_all(const Tensor& in, Tensor& out) {
    count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    const CollectiveDesc d = describe(Collective::all_to_all, in, sequence_++);
    check(d);
    PTOOL_REQUIRE(in.numel() % size_ == 0 && out.numel() == in.numel(),
                  "all_to_all: {} elements over {} ranks", in.numel(), size_);
    const int chunk = as_int(in.nbytes() / size_, collective_name(Collective::all_to_all));
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Ialltoall(in.raw(), chunk, MPI_BYTE, out.raw(), chunk, MPI_BYTE, comm_, &req));
    wait(req, d);
}

void MpiCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                                   const std::vector<int64_t>& recv_rows) {
    count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    check_all_to_all_v(in, send_rows, out, recv_rows, size_);
    const CollectiveDesc d = describe("all_to_all_v", in, sequence_++, -1, true);
    check(d);
    // every rank's splits, so that every rank names the same disagreement
    std::vector<int64_t> all_sends(static_cast<size_t>(size_) * size_), all_recvs(all_sends.size());
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Iallgather(send_rows.data(), size_, MPI_INT64_T, all_sends.data(), size_, MPI_INT64_T,
                                   comm_, &req));
    wait(req, d);
    PTOOL_CHECK_MPI(MPI_Iallgather(recv_rows.data(), size_, MPI_INT64_T, all_recvs.data(), size_, MPI_INT64_T,
                                   comm_, &req));
    wait(req, d);
    std::vector<std::vector<int64_t>> sends(size_), recvs(size_);
    for (int r = 0; r < size_; ++r)
        sends[r].assign(all_sends.begin() + r * size_, all_sends.begin() + (r + 1) * size_),
            recvs[r].assign(all_recvs.begin() + r * size_, all_recvs.begin() + (r + 1) * size_);
    const std::string bad = all_to_all_v_mismatch(sends, recvs, [&](int r) { return world_ranks_[r]; });
    if (!bad.empty()) throw RuntimeError(bad, RuntimeError::Kind::mismatch);
    const int64_t row = static_cast<int64_t>(row_numel(in) * dtype_size(in.dtype()));
    std::vector<int> scounts(size_), sdispls(size_), rcounts(size_), rdispls(size_);
    int64_t so = 0, ro = 0;
    for (int j = 0; j < size_; ++j) {
        scounts[j] = as_int(send_rows[j] * row, "all_to_all_v"), sdispls[j] = as_int(so, "all_to_all_v");
        rcounts[j] = as_int(recv_rows[j] * row, "all_to_all_v"), rdispls[j] = as_int(ro, "all_to_all_v");
        so += send_rows[j] * row, ro += recv_rows[j] * row;
    }
    PTOOL_CHECK_MPI(MPI_Ialltoallv(in.raw(), scounts.data(), sdispls.data(), MPI_BYTE, out.raw(),
                                   rcounts.data(), rdispls.data(), MPI_BYTE, comm_, &req));
    wait(req, d);
}

void MpiCommunicator::barrier() {
    const CollectiveDesc d = describe("barrier", sequence_++);
    check(d);
    MPI_Request req;
    PTOOL_CHECK_MPI(MPI_Ibarrier(comm_, &req));
    wait(req, d);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
    const CollectiveDesc d = describe("split", sequence_++);
    check(d);
    MPI_Comm sub;
    PTOOL_CHECK_MPI(MPI_Comm_split(comm_, color, key, &sub));
    auto out = std::make_unique<MpiCommunicator>(sub, options_);
    MPI_Comm_free(&sub);
    return out;
}

void MpiCommunicator::batch_isend_irecv(const std::vector<P2POp>& ops) {
    const auto world = [&](int r) { return world_ranks_[r]; };
    check_p2p_ops(ops, rank_, size_, world);
    for (const P2POp& op : ops)
        if (op.tag > (tag_ub_ - 1) / 2)
            throw RuntimeError(
                fmt::format("rank {}: {} with rank {}: tag {} is above what MPI carries here ({})",
                            world(rank_), p2p_op_name(op.kind), world(op.peer), op.tag, (tag_ub_ - 1) / 2),
                RuntimeError::Kind::misuse);
    count_p2p(ops);
    if (ops.empty()) return;
    auto batch = std::make_shared<std::vector<MpiP2P>>();
    batch->reserve(ops.size());  // the requests point into it: no reallocation
    try {
        post_and_complete(*batch, ops);
    } catch (...) {  // MPI may still use what was posted
        give_up(batch);
        throw;
    }
}

void MpiCommunicator::post_and_complete(std::vector<MpiP2P>& batch, const std::vector<P2POp>& ops) {
    const auto world = [&](int r) { return world_ranks_[r]; };
    for (const P2POp& op : ops) {
        MpiP2P& m = batch.emplace_back();
        m.kind = op.kind, m.peer = op.peer, m.tensor = *op.tensor,
        m.desc = describe_p2p(*op.tensor, op.tag, op.kind);
        const int bytes = as_int(m.desc.nbytes(), p2p_op_name(op.kind));
        if (op.kind == P2POp::Kind::send) {
            PTOOL_CHECK_MPI(
                MPI_Issend(&m.desc, sizeof m.desc, MPI_BYTE, op.peer, 2 * op.tag, comm_, &m.header));
            PTOOL_CHECK_MPI(
                MPI_Issend(m.tensor.raw(), bytes, MPI_BYTE, op.peer, 2 * op.tag + 1, comm_, &m.payload));
        } else {
            PTOOL_CHECK_MPI(
                MPI_Irecv(&m.theirs, sizeof m.theirs, MPI_BYTE, op.peer, 2 * op.tag, comm_, &m.header));
        }
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout_seconds);
    const MpiP2P& first = batch.front();
    set_rank_activity("in " + p2p_op_str(first.kind, world(first.peer), first.desc));
    for (int spins = 0;; ++spins) {
        bool all_done = true;
        std::set<std::pair<int, int64_t>> blocked;  // (peer, tag) of a recv still waiting for its descriptor
        for (MpiP2P& m : batch) {
            int done = 0;
            if (m.kind == P2POp::Kind::send && m.stage != MpiP2P::Stage::done) {
                int header = 0;
                PTOOL_CHECK_MPI(MPI_Test(&m.header, &header, MPI_STATUS_IGNORE));
                PTOOL_CHECK_MPI(MPI_Test(&m.payload, &done, MPI_STATUS_IGNORE));
                if (header && done) m.stage = MpiP2P::Stage::done;
            }
            if (m.kind == P2POp::Kind::recv && m.stage == MpiP2P::Stage::header) {
                // a channel's descriptors are read in posting order: its bytes' receives are posted in it too
                if (!blocked.insert({m.peer, m.desc.tag}).second) {
                    all_done = false;
                    continue;
                }
                PTOOL_CHECK_MPI(MPI_Test(&m.header, &done, MPI_STATUS_IGNORE));
                if (!done) {
                    all_done = false;
                    continue;
                }
                blocked.erase({m.peer, m.desc.tag});
                const int tag = static_cast<int>(2 * m.desc.tag + 1);
                if (!m.theirs.same_tensor(m.desc)) {  // drain its bytes (its sender completes), then fail
                    m.scratch.resize(m.theirs.nbytes());
                    PTOOL_CHECK_MPI(MPI_Irecv(m.scratch.data(),
                                              as_int(m.scratch.size(), collective_name(Collective::recv)),
                                              MPI_BYTE, m.peer, tag, comm_, &m.payload));
                    throw p2p_mismatch(world(rank_), world(m.peer), m.desc, m.theirs);
                }
                PTOOL_CHECK_MPI(MPI_Irecv(m.tensor.raw(),
                                          as_int(m.desc.nbytes(), collective_name(Collective::recv)),
                                          MPI_BYTE, m.peer, tag, comm_, &m.payload));
                m.stage = MpiP2P::Stage::payload;
            }
            if (m.kind == P2POp::Kind::recv && m.stage == MpiP2P::Stage::payload) {
                PTOOL_CHECK_MPI(MPI_Test(&m.payload, &done, MPI_STATUS_IGNORE));
                if (done) m.stage = MpiP2P::Stage::done;
            }
            all_done = all_done && m.stage == MpiP2P::Stage::done;
        }
        if (all_done) break;
        if (options_.timeout_seconds > 0 && std::chrono::steady_clock::now() >= deadline) {
            const MpiP2P* pending = nullptr;
            for (const MpiP2P& m : batch)
                if (!pending && m.stage != MpiP2P::Stage::done) pending = &m;
            throw p2p_timeout(world(rank_), pending->kind, world(pending->peer), pending->desc,
                              options_.timeout_seconds, "");
        }
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    set_rank_activity("after " + p2p_op_str(first.kind, world(first.peer), first.desc));
}

}  // namespace ptool
