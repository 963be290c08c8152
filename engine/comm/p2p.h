// Point-to-point's shared pieces (comm/communicator.h has the interface and its semantics): the
// checks every communicator makes on a batch before posting it, the descriptor a message carries
// (dtype and shape, what the receiver compares with what its tensor expects), and the messages
// that name both ranks, the tag and both descriptors. Each backend matches and moves the bytes
// its own way (threads: comm/p2p_board.h; mpi: comm_mpi.cpp; nccl: comm_nccl.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ptool {

// What a message holds. Trivially copyable: MPI and NCCL send it as bytes ahead of the payload.
struct P2PDesc {
    int32_t dtype = 0;
    int32_t ndim = 0;
    int64_t dims[8] = {};  // the first 8 dims (numel guards the rest)
    int64_t numel = 0;
    int64_t tag = 0;
    int32_t op = 0;  // the P2POp::Kind of the op that describes itself
    int32_t unused = 0;

    bool same_tensor(const P2PDesc& other) const;  // dtype and shape
    std::string tensor_str() const;                // "float32 [4, 8]"
    size_t nbytes() const;
};
P2PDesc describe_p2p(const Tensor& t, int tag, P2POp::Kind op);

Collective p2p_collective(P2POp::Kind kind);  // Collective::send, Collective::recv
const char* p2p_op_name(P2POp::Kind kind);    // "send", "recv": the collective's name

// "send to rank 1 (tag 7, float32 [4, 8])" / "recv from rank 0 (tag 7, float32 [4, 8])"; ranks are world
// ranks.
std::string p2p_op_str(P2POp::Kind kind, int peer_world, const P2PDesc& d);

// Before anything is posted: every op has a tensor, its peer is a rank of the group other than
// this one, its tag is >= 0. RuntimeError (misuse) otherwise. world(r): group rank r's world rank.
void check_p2p_ops(const std::vector<P2POp>& ops, int rank, int size, const std::function<int(int)>& world);

// RuntimeError (mismatch): "rank 1: recv from rank 0 (tag 7) expects float32 [4, 8], rank 0 sent float32 [4,
// 16]"
RuntimeError p2p_mismatch(int me_world, int peer_world, const P2PDesc& expected, const P2PDesc& sent);

// RuntimeError (mismatch) where a peer posted another op in its place (nccl pairs ops by posting order):
// "rank 0: send to rank 1 (tag 0, float32 [4, 8]): no matching recv: rank 1 posted send to rank 0 (tag 0,
// ...) in its place"
RuntimeError p2p_unmatched(int me_world, P2POp::Kind kind, int peer_world, const P2PDesc& mine,
                           const P2PDesc& theirs);

// RuntimeError (timeout): "rank 1: recv from rank 0 (tag 7, float32 [4, 8]): no matching send within 5 s"
// followed by " (context)" when there is one (what the peer is doing, where the backend knows it).
RuntimeError p2p_timeout(int me_world, P2POp::Kind kind, int peer_world, const P2PDesc& d, double seconds,
                         const std::string& context);

}  // namespace ptool
