// Point-to-point's shared pieces: descriptors, batch checks, messages; send and recv as a batch of one.
#include "comm/p2p.h"

#include <algorithm>

namespace ptool {
namespace {
P2POp::Kind matching(P2POp::Kind kind) {  // what a peer posts to match `kind`
    return kind == P2POp::Kind::send ? P2POp::Kind::recv : P2POp::Kind::send;
}
}  // namespace

void Communicator::send(const Tensor& t, int peer, int tag) {
    Tensor view = t;  // shallow: the op reads t's storage
    batch_isend_irecv({P2POp{P2POp::Kind::send, &view, peer, tag}});
}

void Communicator::recv(Tensor& t, int peer, int tag) {
    batch_isend_irecv({P2POp{P2POp::Kind::recv, &t, peer, tag}});
}

void Communicator::count_p2p(const std::vector<P2POp>& ops) {
    for (const P2POp& op : ops) count(p2p_collective(op.kind), static_cast<int64_t>(op.tensor->nbytes()));
}

bool P2PDesc::same_tensor(const P2PDesc& o) const {
    return dtype == o.dtype && ndim == o.ndim && numel == o.numel &&
           std::equal(dims, dims + std::min(ndim, 8), o.dims);
}

std::string P2PDesc::tensor_str() const {
    std::string shape = "[";
    for (int i = 0; i < std::min(ndim, 8); ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
    shape += ndim > 8 ? ", ...]" : "]";
    return fmt::format("{} {}", dtype_name(static_cast<DType>(dtype)), shape);
}

size_t P2PDesc::nbytes() const {
    return static_cast<size_t>(numel) * dtype_size(static_cast<DType>(dtype));
}

P2PDesc describe_p2p(const Tensor& t, int tag, P2POp::Kind op) {
    P2PDesc d;
    d.dtype = static_cast<int32_t>(t.dtype());
    d.ndim = static_cast<int32_t>(t.dim());
    for (int i = 0; i < std::min(d.ndim, 8); ++i) d.dims[i] = t.shape()[i];
    d.numel = t.numel();
    d.tag = tag;
    d.op = static_cast<int32_t>(op);
    return d;
}

Collective p2p_collective(P2POp::Kind kind) {
    return kind == P2POp::Kind::send ? Collective::send : Collective::recv;
}

const char* p2p_op_name(P2POp::Kind kind) {
    return collective_name(p2p_collective(kind));
}

std::string p2p_op_str(P2POp::Kind kind, int peer_world, const P2PDesc& d) {
    return fmt::format("{} {} rank {} (tag {}, {})", p2p_op_name(kind),
                       kind == P2POp::Kind::send ? "to" : "from", peer_world, d.tag, d.tensor_str());
}

void check_p2p_ops(const std::vector<P2POp>& ops, int rank, int size, const std::function<int(int)>& world) {
    for (const P2POp& op : ops) {
        const char* name = p2p_op_name(op.kind);
        if (!op.tensor || !op.tensor->defined())
            throw RuntimeError(fmt::format("rank {}: {} to/from rank {} (tag {}) has no tensor", world(rank),
                                           name, op.peer, op.tag),
                               RuntimeError::Kind::misuse);
        if (op.peer < 0 || op.peer >= size)
            throw RuntimeError(fmt::format("rank {}: {} with peer {}, outside this group of {} ranks",
                                           world(rank), name, op.peer, size),
                               RuntimeError::Kind::misuse);
        if (op.peer == rank)
            throw RuntimeError(
                fmt::format("rank {}: {} with itself as the peer (tag {}): point-to-point needs another "
                            "rank, as torch.distributed's",
                            world(rank), name, op.tag),
                RuntimeError::Kind::misuse);
        if (op.tag < 0)
            throw RuntimeError(fmt::format("rank {}: {} with rank {}: tag {} is negative", world(rank), name,
                                           world(op.peer), op.tag),
                               RuntimeError::Kind::misuse);
    }
}

RuntimeError p2p_mismatch(int me_world, int peer_world, const P2PDesc& expected, const P2PDesc& sent) {
    const std::string sent_str = sent.tag == expected.tag
                                     ? sent.tensor_str()
                                     : fmt::format("{} with tag {}", sent.tensor_str(), sent.tag);
    return RuntimeError(
        fmt::format("rank {}: recv from rank {} (tag {}) expects {}, rank {} sent {}", me_world, peer_world,
                    expected.tag, expected.tensor_str(), peer_world, sent_str),
        RuntimeError::Kind::mismatch);
}

RuntimeError p2p_unmatched(int me_world, P2POp::Kind kind, int peer_world, const P2PDesc& mine,
                           const P2PDesc& theirs) {
    const bool send = kind == P2POp::Kind::send;
    const auto their_kind = static_cast<P2POp::Kind>(theirs.op);
    return RuntimeError(
        fmt::format(
            "rank {}: {}: no matching {}: rank {} posted {} in its place{}", me_world,
            p2p_op_str(kind, peer_world, mine), p2p_op_name(matching(kind)), peer_world,
            p2p_op_str(their_kind, me_world, theirs),
            send && their_kind == P2POp::Kind::send ? " (sends that cross outside one batch deadlock)" : ""),
        RuntimeError::Kind::mismatch);
}

RuntimeError p2p_timeout(int me_world, P2POp::Kind kind, int peer_world, const P2PDesc& d, double seconds,
                         const std::string& context) {
    return RuntimeError(
        fmt::format("rank {}: {}: no matching {} within {} s{}", me_world, p2p_op_str(kind, peer_world, d),
                    p2p_op_name(matching(kind)), seconds, context.empty() ? "" : " (" + context + ")"),
        RuntimeError::Kind::timeout);
}

}  // namespace ptool
