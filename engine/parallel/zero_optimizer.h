// ZeRO-1 and ZeRO-2 under replicate() (data_parallel's zero_stage; docs/plan_format.md): DeepSpeed's
// ZeRO stages 1 and 2 and Megatron-Core's distributed optimizer, over DDP's buckets.
//
// The flat parameter space is each DDP bucket's (its parameters in the bucket's order, the
// TP-local tensors under tensor parallelism), as Megatron's distributed optimizer cuts it: bucket b
// of N elements is padded to d x S (S = ceil(N / d)) and dp rank r owns elements [r S, (r+1) S) of
// it, so a parameter may straddle two ranks' shards (torch's ZeroRedundancyOptimizer instead hands
// whole parameters to ranks; ptool follows Megatron and DeepSpeed). Per step:
//   stage 1  the buckets' all_reduce(avg) as DDP (DataParallel::after_backward); clip as DDP (every
//            rank holds the full gradients)
//   stage 2  each bucket's gradients reduce_scattered(avg) (site "bucket K", DDP's): the rank keeps
//            its shard of them and the full gradients are freed until the next step's backward;
//            clip_grad_norm's squares are the shards', summed over the dp ranks
//   both     the optimizer steps only the pieces of the parameters in the rank's shards, so its
//            state is 1/d of DDP's; then each bucket's updated shards are all_gathered into every
//            rank's parameters (site "zero_params K").
// The parameters stay whole on every rank in the model's dtype (under mixed precision these are the
// masters the optimizer steps; unlike Megatron, which keeps the fp32 masters sharded and gathers the
// bf16 copies, ptool gathers the masters and casts them as DDP does).
#pragma once

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "comm/communicator.h"
#include "model/optimizer.h"
#include "parallel/grad_norm.h"

namespace ptool {

class ZeroOptimizer {
public:
    struct Bucket {
        std::string root;
        int index = 0;  // among its root's buckets, in reduction order
        std::vector<ParamPtr> params;
    };
    // rotation: dp rank r updates the shard of rank (r + rotation) mod d: 0 but under fault injection.
    // reduce: the dtype the gradients are reduced in (mixed precision's reduce_dtype, else theirs).
    // grad_reduce: how stage 2's reduce_scatter combines the ranks' gradients (avg, or sum under
    // loss_normalization global_tokens).
    ZeroOptimizer(int stage, int rotation, std::vector<Bucket> buckets, Communicator& dp, Backend& be,
                  DType reduce, ReduceOp grad_reduce = ReduceOp::avg);
    int stage() const { return stage_; }
    bool manages(const Parameter* p) const;

    // Stage 2: the full gradients the backward accumulates into, allocated again (zeros).
    void before_step();
    // Stage 2: each bucket's gradients reduce_scattered (grad_reduce) into this rank's shard; the full
    // ones freed.
    void reduce_scatter_gradients();
    // Stage 2: this rank's pieces of p's gradient (stage 1: its gradient, whole).
    std::vector<Tensor> grad_pieces(const Parameter* p) const;
    // The step: the optimizer on this rank's pieces of the managed parameters plus `others` whole
    // (one optimizer step), then each bucket's shards all_gathered into every rank's parameters.
    void step(Optimizer& opt, const std::vector<std::pair<std::string, ParamPtr>>& others);
    // Stage 2, verification's: every managed parameter's full gradient again (all_gathered from the
    // shards), so that it can be recorded; collective over the dp ranks.
    void gather_gradients();

    // Bytes per step of this rank's collectives: gradients reduce_scattered, parameters all_gathered.
    int64_t reduce_scatter_bytes() const { return reduce_scatter_bytes_; }
    int64_t all_gather_bytes() const { return all_gather_bytes_; }

private:
    struct Span {  // a parameter's place in its bucket's flat space
        ParamPtr p;
        int64_t offset = 0, numel = 0;
    };
    struct Flat {
        std::string root;
        int index = 0;
        std::vector<Span> spans;
        int64_t numel = 0, shard = 0;  // elements, and per rank (padded)
        Tensor grad_shard;             // stage 2: this rank's shard of the averaged gradients
    };
    // The pieces of bucket f's parameters in its shard `owner`: (span, first element in the parameter,
    // first element in the shard, length).
    struct Piece {
        const Span* span;
        int64_t at = 0, in_shard = 0, length = 0;
    };
    std::vector<Piece> pieces(const Flat& f, int owner) const;

    int stage_, owner_;  // the shard this rank updates (its own dp rank but under fault injection)
    std::vector<Flat> flats_;
    std::unordered_set<const Parameter*> managed_;  // every flat's parameters (manages: asked per parameter)
    Communicator& dp_;
    Backend& be_;
    DType reduce_;
    ReduceOp grad_reduce_ = ReduceOp::avg;
    int64_t reduce_scatter_bytes_ = 0, all_gather_bytes_ = 0;
};

}  // namespace ptool
