#include "comm/comm_nccl.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "comm/device_reduce.h"
#include "comm/nccl_api.h"
#include "comm/p2p.h"
#include "comm/rank_supervisor.h"
#include "core/check.h"

namespace ptool {
namespace {

static_assert(sizeof(NcclId) == sizeof(ncclUniqueId), "NcclId holds an ncclUniqueId");

const NcclApi& nccl() {
    const NcclApi* api = nccl_api();
    if (!api) throw RuntimeError(fmt::format("nccl communicator: {}", nccl_load_error()));
    return *api;
}

ncclComm_t as_comm(void* c) {
    return static_cast<ncclComm_t>(c);
}
cudaStream_t stream() {
    return static_cast<cudaStream_t>(cuda_current_stream());
}

ncclConfig_t nonblocking() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // calls return ncclInProgress; await() polls, so a lost peer is a timeout
    return config;
}

// A device buffer from the caching allocator, for the duration of one collective.
struct DeviceBuffer {
    explicit DeviceBuffer(size_t n) : bytes(n), p(n ? device_memory().allocate(n) : nullptr) {}
    ~DeviceBuffer() {
        if (p) device_memory().release(p, bytes);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    char* at(size_t offset) const { return static_cast<char*>(p) + offset; }
    size_t bytes;
    void* p;
};

// A tensor's bytes on the device: itself, or a staged copy of a host tensor (copied back by done()).
struct OnDevice {
    explicit OnDevice(const Tensor& t)
        : host(t), dev(t.device() == Device::cuda ? t : t.to_device(Device::cuda)) {}
    void done() {  // the collective wrote dev: bring it home
        if (host.device() == Device::cpu && host.nbytes())
            copy_bytes(host.raw(), Device::cpu, dev.raw(), Device::cuda, host.nbytes());
    }
    Tensor host, dev;
};

}  // namespace

NcclId nccl_unique_id() {
    ncclUniqueId id;
    PTOOL_CHECK_NCCL(nccl().get_unique_id(&id));
    NcclId out;
    std::memcpy(out.bytes, &id, sizeof id);
    return out;
}

NcclCommunicator::NcclCommunicator(const NcclId& id, int rank, int size, CommOptions options,
                                   std::shared_ptr<AbortState> abort)
    : comm_(nullptr), rank_(rank), size_(size), options_(options), abort_(std::move(abort)) {
    for (int r = 0; r < size; ++r) world_ranks_.push_back(r);
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes, sizeof uid);
    ncclConfig_t config = nonblocking();
    ncclComm_t c = nullptr;
    const auto failed = [&](const std::string& message) {
        comm_ = c;  // what NCCL made of it is aborted
        fail(message);
    };
    PTOOL_CHECK_NCCL_WITH(nccl().init_rank_config(&c, size, uid, rank, &config), failed);
    comm_ = c;
    await(describe("init", 0), false);  // named in a timeout message
}

NcclCommunicator::NcclCommunicator(void* comm, int rank, int size, CommOptions options,
                                   std::shared_ptr<AbortState> abort, std::vector<int> world_ranks)
    : comm_(comm),
      rank_(rank),
      size_(size),
      options_(options),
      abort_(std::move(abort)),
      world_ranks_(std::move(world_ranks)) {}

NcclCommunicator::~NcclCommunicator() {
    if (!comm_) return;
    const NcclApi* api = nccl_api();
    if (!api) return;
    ncclComm_t c = as_comm(comm_);
    if (abort_ && abort_->aborted.load()) {
        api->abort(c);  // peers may be gone: finalize could wait for them
        return;
    }
    // finalize flushes what is queued; poll it like any collective, abort if it never completes
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout_seconds);
    ncclResult_t state = api->finalize(c);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        api->get_async_error(c, &state);
    }
    if (state == ncclSuccess)
        api->destroy(c);
    else
        api->abort(c);
}

void NcclCommunicator::fail(const std::string& message, RuntimeError::Kind kind) {
    const bool named = kind != RuntimeError::Kind::other;
    const std::string msg = named ? message : fmt::format("rank {}: {}", world_ranks_[rank_], message);
    if (!named) kind = RuntimeError::Kind::rank_failed;  // the message names the rank now
    if (abort_) abort_->abort(msg, kind);
    if (comm_) nccl().abort(as_comm(comm_)), comm_ = nullptr;
    throw RuntimeError(msg, kind);
}

void NcclCommunicator::await(const CollectiveDesc& d, bool stream_too) {
    await(d.str(), stream_too, [&] {
        return RuntimeError(
            fmt::format("rank {} timed out after {} s in {} (a rank never arrived, or is in another "
                        "collective)",
                        world_ranks_[rank_], options_.timeout_seconds, d.str()),
            RuntimeError::Kind::timeout);
    });
}

void NcclCommunicator::await(const std::string& what, bool stream_too,
                             const std::function<RuntimeError()>& timeout) {
    if (!comm_)
        throw RuntimeError(fmt::format("rank {}: the nccl communicator was aborted", world_ranks_[rank_]),
                           RuntimeError::Kind::rank_failed);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout_seconds);
    set_rank_activity("in " + what);
    for (int spins = 0;; ++spins) {
        ncclResult_t state = ncclSuccess;
        nccl().get_async_error(as_comm(comm_), &state);
        if (state != ncclSuccess && state != ncclInProgress)
            fail(fmt::format("rank {}: NCCL error in {}: {}", world_ranks_[rank_], what,
                             nccl_error_string(state)),
                 RuntimeError::Kind::rank_failed);
        bool done = state == ncclSuccess;
        if (done && stream_too) {
            const cudaError_t e = cudaStreamQuery(stream());
            if (e == cudaErrorNotReady)
                done = false;
            else if (e != cudaSuccess)
                fail(fmt::format("rank {}: CUDA error in {}: {}", world_ranks_[rank_], what,
                                 cudaGetErrorString(e)),
                     RuntimeError::Kind::rank_failed);
        }
        if (done) break;
        if (abort_ && abort_->aborted.load()) {
            nccl().abort(as_comm(comm_)), comm_ = nullptr;
            std::lock_guard<std::mutex> lk(abort_->mu);
            throw AbortedError(abort_->message, abort_->kind);
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            const RuntimeError e = timeout();
            fail(e.what(), e.kind());
        }
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    set_rank_activity("after " + what);
}

std::vector<char> NcclCommunicator::exchange(const CollectiveDesc& d, const void* mine, size_t bytes) {
    DeviceBuffer buf(bytes * size_);
    copy_bytes(buf.at(bytes * rank_), Device::cuda, mine, Device::cpu, bytes);
    PTOOL_CHECK_NCCL_WITH(
        nccl().all_gather(buf.at(bytes * rank_), buf.p, bytes, ncclUint8, as_comm(comm_), stream()), fail);
    await(d);
    std::vector<char> all(bytes * size_);
    copy_bytes(all.data(), Device::cpu, buf.p, Device::cuda, all.size());
    return all;
}

std::vector<CollectiveDesc> NcclCommunicator::check(const CollectiveDesc& d, bool always) {
    if (!options_.check_consistency && !always) return {};
    const std::vector<char> bytes = exchange(d, &d, sizeof d);
    std::vector<CollectiveDesc> all(size_);
    std::memcpy(all.data(), bytes.data(), bytes.size());
    for (int r = 0; r < size_; ++r) {
        CollectiveDesc mine = d, theirs = all[r];
        if (!options_.check_consistency) mine.sequence = theirs.sequence = 0;  // shapes still guard memory
        if (theirs.matches(mine)) continue;
        const int lo = std::min(rank_, r), hi = std::max(rank_, r);
        fail(fmt::format("collective mismatch: rank {} {} vs rank {} {}", world_ranks_[hi], all[hi].str(),
                         world_ranks_[lo], all[lo].str()),
             RuntimeError::Kind::mismatch);
    }
    return all;
}

void NcclCommunicator::reduce_chunk(const void* in, void* out, int64_t rows, int64_t row, DType dtype,
                                    ReduceOp op, const CollectiveDesc& d) {
    const size_t es = dtype_size(dtype);
    const Chunk mine = chunk_of(rows, size_, rank_);
    const size_t mine_bytes = static_cast<size_t>(mine.length * row) * es;
    DeviceBuffer recv(mine_bytes * size_);
    const char* src = static_cast<const char*>(in);
    // chunk j of every rank's buffer to rank j, in one group (the bytes of a ring reduce-scatter)
    PTOOL_CHECK_NCCL_WITH(nccl().group_start(), fail);
    for (int j = 0; j < size_; ++j) {
        const Chunk c = chunk_of(rows, size_, j);
        const size_t c_bytes = static_cast<size_t>(c.length * row) * es;
        if (j == rank_) {
            if (mine_bytes)
                PTOOL_CHECK_CUDA(cudaMemcpyAsync(recv.at(j * mine_bytes), src + c.offset * row * es,
                                                 mine_bytes, cudaMemcpyDeviceToDevice, stream()));
            continue;
        }
        if (c_bytes)
            PTOOL_CHECK_NCCL_WITH(
                nccl().send(src + c.offset * row * es, c_bytes, ncclUint8, j, as_comm(comm_), stream()),
                fail);
        if (mine_bytes)
            PTOOL_CHECK_NCCL_WITH(
                nccl().recv(recv.at(j * mine_bytes), mine_bytes, ncclUint8, j, as_comm(comm_), stream()),
                fail);
    }
    PTOOL_CHECK_NCCL_WITH(nccl().group_end(), fail);
    await(d);
    if (!mine_bytes) return;
    std::vector<const void*> ins(size_);
    for (int j = 0; j < size_; ++j) ins[j] = recv.at(j * mine_bytes);
    device_reduce_in_rank_order(ins, {out}, mine.length * row, dtype, op);
}

void NcclCommunicator::all_reduce(Tensor& t, ReduceOp op) {
    count(Collective::all_reduce, static_cast<int64_t>(t.nbytes()));
    const CollectiveDesc d = describe(Collective::all_reduce, t, sequence_++);
    check(d);
    OnDevice x(t);
    const int64_t n = t.numel();
    const size_t es = dtype_size(t.dtype());
    // every rank's part padded to torch.chunk's chunk size, so one ncclAllGather lands each at its offset
    const int64_t per = (n + size_ - 1) / size_;
    if (n == 0) return;
    const bool even = per * size_ == n;
    DeviceBuffer part(per * es), padded(even ? 0 : per * size_ * es);
    reduce_chunk(x.dev.raw(), part.p, n, 1, t.dtype(), op, d);
    void* gathered = even ? x.dev.raw() : padded.p;
    PTOOL_CHECK_NCCL_WITH(nccl().all_gather(part.p, gathered, per * es, ncclUint8, as_comm(comm_), stream()),
                          fail);
    if (!even)
        PTOOL_CHECK_CUDA(cudaMemcpyAsync(x.dev.raw(), padded.p, n * es, cudaMemcpyDeviceToDevice, stream()));
    await(d);
    x.done();
}

void NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
    count(Collective::all_gather, static_cast<int64_t>(out.nbytes()));
    const CollectiveDesc d = describe(Collective::all_gather, in, sequence_++, -1, true);
    const std::vector<CollectiveDesc> all = check(d, true);  // dim-0 sizes may differ: always exchanged
    const int64_t row = row_numel(in);
    const size_t row_bytes = static_cast<size_t>(row) * dtype_size(in.dtype());
    std::vector<int64_t> rows(size_);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) total += rows[r] = all[r].ndim ? all[r].dims[0] : 1;
    PTOOL_REQUIRE(out.numel() == total * row, "all_gather: output {} cannot hold {} rows of {}",
                  shape_str(out.shape()), total, row);
    OnDevice src(in), dst(out);
    const bool equal = std::all_of(rows.begin(), rows.end(), [&](int64_t k) { return k == rows[0]; });
    if (equal) {
        PTOOL_CHECK_NCCL_WITH(nccl().all_gather(src.dev.raw(), dst.dev.raw(), rows[0] * row_bytes, ncclUint8,
                                                as_comm(comm_), stream()),
                              fail);
    } else {  // uneven: rank r broadcasts its rows into their place
        PTOOL_CHECK_NCCL_WITH(nccl().group_start(), fail);
        int64_t offset = 0;
        for (int r = 0; r < size_; ++r) {
            char* at = static_cast<char*>(dst.dev.raw()) + offset * row_bytes;
            if (rows[r])
                PTOOL_CHECK_NCCL_WITH(
                    nccl().broadcast(r == rank_ ? src.dev.raw() : at, at, rows[r] * row_bytes, ncclUint8, r,
                                     as_comm(comm_), stream()),
                    fail);
            offset += rows[r];
        }
        PTOOL_CHECK_NCCL_WITH(nccl().group_end(), fail);
    }
    await(d);
    dst.done();
}

void NcclCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
    count(Collective::reduce_scatter, static_cast<int64_t>(in.nbytes()));
    const CollectiveDesc d = describe(Collective::reduce_scatter, in, sequence_++);
    check(d);
    const RowChunk rc = reduce_scatter_rows(in, out, size_, rank_);
    OnDevice src(in), dst(out);
    reduce_chunk(src.dev.raw(), dst.dev.raw(), rc.rows, rc.row, in.dtype(), op, d);
    await(d);
    dst.done();
}

void NcclCommunicator::broadcast(Tensor& t, int root) {
    count(Collective::broadcast, static_cast<int64_t>(t.nbytes()));
    PTOOL_REQUIRE(root >= 0 && root < size_, "broadcast root {} outside [0, {})", root, size_);
    const CollectiveDesc d = describe(Collective::broadcast, t, sequence_++, root);
    check(d);
    OnDevice x(t);
    PTOOL_CHECK_NCCL_WITH(
        nccl().broadcast(x.dev.raw(), x.dev.raw(), t.nbytes(), ncclUint8, root, as_comm(comm_), stream()),
        fail);
    await(d);
    x.done();
}

void NcclCommunicator::all_to_all(const Tensor& in, Tensor& out) {
    count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    PTOOL_REQUIRE(in.numel() % size_ == 0 && out.numel() == in.numel(),
                  "all_to_all: {} elements over {} ranks", in.numel(), size_);
    const CollectiveDesc d = describe(Collective::all_to_all, in, sequence_++);
    check(d);
    OnDevice src(in), dst(out);
    const size_t chunk = in.nbytes() / size_;
    const char* s = static_cast<const char*>(src.dev.raw());
    char* o = static_cast<char*>(dst.dev.raw());
    PTOOL_CHECK_NCCL_WITH(nccl().group_start(), fail);
    for (int j = 0; j < size_ && chunk; ++j) {
        if (j == rank_) {
            PTOOL_CHECK_CUDA(
                cudaMemcpyAsync(o + j * chunk, s + j * chunk, chunk, cudaMemcpyDeviceToDevice, stream()));
            continue;
        }
        PTOOL_CHECK_NCCL_WITH(nccl().send(s + j * chunk, chunk, ncclUint8, j, as_comm(comm_), stream()),
                              fail);
        PTOOL_CHECK_NCCL_WITH(nccl().recv(o + j * chunk, chunk, ncclUint8, j, as_comm(comm_), stream()),
                              fail);
    }
    PTOOL_CHECK_NCCL_WITH(nccl().group_end(), fail);
    await(d);
    dst.done();
}

void NcclCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                                    const std::vector<int64_t>& recv_rows) {
    count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    check_all_to_all_v(in, send_rows, out, recv_rows, size_);
    const CollectiveDesc d = describe("all_to_all_v", in, sequence_++, -1, true);
    check(d);
    // every rank's splits (send then recv), so that every rank names the same disagreement
    std::vector<int64_t> mine(send_rows);
    mine.insert(mine.end(), recv_rows.begin(), recv_rows.end());
    const size_t each = mine.size() * sizeof(int64_t);
    const std::vector<char> bytes = exchange(d, mine.data(), each);
    std::vector<std::vector<int64_t>> sends(size_, std::vector<int64_t>(size_)), recvs = sends;
    for (int r = 0; r < size_; ++r) {
        std::memcpy(sends[r].data(), bytes.data() + r * each, each / 2);
        std::memcpy(recvs[r].data(), bytes.data() + r * each + each / 2, each / 2);
    }
    const std::string bad = all_to_all_v_mismatch(sends, recvs, [&](int r) { return world_ranks_[r]; });
    if (!bad.empty()) throw RuntimeError(bad, RuntimeError::Kind::mismatch);
    OnDevice src(in), dst(out);
    const size_t row = static_cast<size_t>(row_numel(in)) * dtype_size(in.dtype());
    const char* s = static_cast<const char*>(src.dev.raw());
    char* o = static_cast<char*>(dst.dev.raw());
    PTOOL_CHECK_NCCL_WITH(nccl().group_start(), fail);
    for (int j = 0; j < size_; ++j) {
        const size_t sb = static_cast<size_t>(send_rows[j]) * row,
                     rb = static_cast<size_t>(recv_rows[j]) * row;
        if (j == rank_) {
            if (sb) PTOOL_CHECK_CUDA(cudaMemcpyAsync(o, s, sb, cudaMemcpyDeviceToDevice, stream()));
        } else {
            if (sb) PTOOL_CHECK_NCCL_WITH(nccl().send(s, sb, ncclUint8, j, as_comm(comm_), stream()), fail);
            if (rb) PTOOL_CHECK_NCCL_WITH(nccl().recv(o, rb, ncclUint8, j, as_comm(comm_), stream()), fail);
        }
        s += sb, o += rb;
    }
    PTOOL_CHECK_NCCL_WITH(nccl().group_end(), fail);
    await(d);
    dst.done();
}

void NcclCommunicator::barrier() {
    const CollectiveDesc d = describe("barrier", sequence_++);
    check(d, true);  // an all-gather every rank must join
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
    const CollectiveDesc d = describe("split", sequence_++);
    check(d);
    const int64_t mine[2] = {color, key};
    const std::vector<char> bytes = exchange(d, mine, sizeof mine);
    std::vector<std::pair<int64_t, int>> members;  // (key, parent rank) of my color
    for (int r = 0; r < size_; ++r) {
        int64_t theirs[2];
        std::memcpy(theirs, bytes.data() + r * sizeof mine, sizeof mine);
        if (theirs[0] == color) members.push_back({theirs[1], r});
    }
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    std::vector<int> world;
    for (size_t i = 0; i < members.size(); ++i) {
        if (members[i].second == rank_) new_rank = static_cast<int>(i);
        world.push_back(world_ranks_[members[i].second]);
    }
    ncclConfig_t config = nonblocking();
    ncclComm_t sub = nullptr;
    PTOOL_CHECK_NCCL_WITH(nccl().split(as_comm(comm_), color, key, &sub, &config), fail);
    await(d, false);  // the parent's pending split
    auto out = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
        sub, new_rank, static_cast<int>(members.size()), options_, abort_, std::move(world)));
    out->await(d, false);  // the child's initialisation
    return out;
}

// Point-to-point in two groups. (1) Descriptors both ways: for each op this rank sends its own
// descriptor to the peer and receives one from it, so the group completes only once the peer has
// posted as many ops with this rank (a rendezvous whatever NCCL buffers), and both sides learn
// what the other posted: the k-th descriptor from a peer is the one of its k-th op with this rank.
// Its sends pair with this rank's recvs from it, and its recvs with this rank's sends to it, each
// with the first unpaired op of the same tag; both sides check the same pairs and throw the same
// message. (2) The bytes: sends in posting order, receives in their senders' order.
void NcclCommunicator::batch_isend_irecv(const std::vector<P2POp>& ops) {
    const auto world = [&](int r) { return world_ranks_[r]; };
    check_p2p_ops(ops, rank_, size_, world);
    count_p2p(ops);
    if (ops.empty()) return;
    const size_t n = ops.size(), hb = sizeof(P2PDesc);
    std::vector<P2PDesc> mine(n), theirs(n);
    for (size_t i = 0; i < n; ++i) mine[i] = describe_p2p(*ops[i].tensor, ops[i].tag, ops[i].kind);
    const P2POp& first = ops.front();
    const std::string what =
        p2p_op_str(first.kind, world(first.peer), mine.front()) +
        (n > 1 ? fmt::format(" and {} more op{} of its batch", n - 1, n > 2 ? "s" : "") : "");
    const auto timeout = [&] {
        return p2p_timeout(world(rank_), first.kind, world(first.peer), mine.front(),
                           options_.timeout_seconds,
                           n > 1 ? fmt::format("or another of the {} ops of its batch", n) : "");
    };
    // (1) descriptors
    DeviceBuffer out(n * hb), in(n * hb);
    copy_bytes(out.p, Device::cuda, mine.data(), Device::cpu, n * hb);
    PTOOL_CHECK_NCCL_WITH(nccl().group_start(), fail);
    for (size_t i = 0; i < n; ++i) {
        PTOOL_CHECK_NCCL_WITH(
            nccl().send(out.at(i * hb), hb, ncclUint8, ops[i].peer, as_comm(comm_), stream()), fail);
        PTOOL_CHECK_NCCL_WITH(
            nccl().recv(in.at(i * hb), hb, ncclUint8, ops[i].peer, as_comm(comm_), stream()), fail);
    }
    PTOOL_CHECK_NCCL_WITH(nccl().group_end(), fail);
    await(what, true, timeout);
    copy_bytes(theirs.data(), Device::cpu, in.p, Device::cuda, n * hb);
    // pair: partner[i] is the op of the peer's (its descriptor) that op i pairs with; the peer's
    // sends in their posting order, as the bytes will arrive
    std::vector<const P2PDesc*> partner(n, nullptr);
    std::map<int, std::vector<size_t>>
        arrival;                      // peer -> this rank's recv ops in the order of the peer's sends
    for (size_t k = 0; k < n; ++k) {  // theirs[k]: the peer's op with this rank, in the peer's order
        const int peer = ops[k].peer;
        const auto want =
            theirs[k].op == static_cast<int32_t>(P2POp::Kind::send) ? P2POp::Kind::recv : P2POp::Kind::send;
        size_t match = n;
        for (size_t j = 0; j < n && match == n; ++j)
            if (ops[j].kind == want && ops[j].peer == peer && !partner[j] && mine[j].tag == theirs[k].tag)
                match = j;
        if (match == n) {  // the peer's op has no partner here: named from this rank's op in its slot
            fail(p2p_unmatched(world(rank_), ops[k].kind, world(peer), mine[k], theirs[k]).what(),
                 RuntimeError::Kind::mismatch);
        }
        partner[match] = &theirs[k];
        if (want == P2POp::Kind::recv) arrival[peer].push_back(match);
    }
    for (size_t i = 0; i < n; ++i) {  // the receiver's view, on both sides: the same message
        const P2PDesc& other = *partner[i];
        if (other.same_tensor(mine[i])) continue;
        const bool recv = ops[i].kind == P2POp::Kind::recv;
        const int me = world(rank_), peer = world(ops[i].peer);
        fail(recv ? p2p_mismatch(me, peer, mine[i], other).what()
                  : p2p_mismatch(peer, me, other, mine[i]).what(),
             RuntimeError::Kind::mismatch);
    }
    // (2) the bytes
    std::vector<std::unique_ptr<OnDevice>> staged(n);
    for (size_t i = 0; i < n; ++i) staged[i] = std::make_unique<OnDevice>(*ops[i].tensor);
    std::map<int, size_t> next;  // peer -> how many of its messages have a posted receive
    PTOOL_CHECK_NCCL_WITH(nccl().group_start(), fail);
    for (size_t i = 0; i < n; ++i) {
        const int peer = ops[i].peer;
        if (ops[i].kind == P2POp::Kind::send) {
            if (mine[i].nbytes())
                PTOOL_CHECK_NCCL_WITH(nccl().send(staged[i]->dev.raw(), mine[i].nbytes(), ncclUint8, peer,
                                                  as_comm(comm_), stream()),
                                      fail);
        } else {
            const size_t j = arrival[peer][next[peer]++];
            if (mine[j].nbytes())
                PTOOL_CHECK_NCCL_WITH(nccl().recv(staged[j]->dev.raw(), mine[j].nbytes(), ncclUint8, peer,
                                                  as_comm(comm_), stream()),
                                      fail);
        }
    }
    PTOOL_CHECK_NCCL_WITH(nccl().group_end(), fail);
    await(what, true, timeout);
    for (size_t i = 0; i < n; ++i)
        if (ops[i].kind == P2POp::Kind::recv) staged[i]->done();
}

void run_nccl_threads(int n, const CommOptions& options, const std::function<void(Communicator&)>& fn) {
    const NcclId id = nccl_unique_id();
    auto abort = std::make_shared<AbortState>();
    run_threads(
        n, abort,
        [&](int r) {
            cuda_set_thread_device(r);  // rank r on GPU r: its stream, memory and kernels
            backend_for(Device::cuda);  // started (device memory registered) before the first buffer
            return std::make_unique<NcclCommunicator>(id, r, n, options, abort);
        },
        fn);
}

std::unique_ptr<Communicator> make_nccl_world(Communicator& bootstrap, const CommOptions& options) {
    // the calling thread is on the process's GPU (gpu_for_local_rank, chosen before the backend started)
    NcclId id{};
    if (bootstrap.rank() == 0) id = nccl_unique_id();
    Tensor t({static_cast<int64_t>(sizeof id / sizeof(int64_t))}, DType::int64);
    std::memcpy(t.raw(), id.bytes, sizeof id);
    bootstrap.broadcast(t, 0);
    std::memcpy(id.bytes, t.raw(), sizeof id);
    return std::make_unique<NcclCommunicator>(id, bootstrap.rank(), bootstrap.size(), options, nullptr);
}

}  // namespace ptool
