// Fault injection: bugs put into a parallel run on purpose (PTOOL_FAULT=KIND:FQN, FQN * for every
// place) to prove that verify catches and localises them. The faults are a RunLayer: they wrap the
// styles' hooks, the mesh's communicators and the data-parallel resolution from outside, so no
// production path knows about them.
//   tensor parallel (module FQNs)
//     skip_all_reduce        a module's forward reduction of partial sums is skipped (rowwise)
//     bias_every_rank        rowwise's bias is added by every rank before the reduction
//     skip_grad_all_reduce   a module's reduction of its partial input gradient is skipped (colwise)
//     wrong_shard_dim        a sharded parameter is cut along the other dim
//     wrong_shard_offset     a shard is taken one row late (early at the end)
//     wrong_src_rank         src_data_rank's broadcast is sent from the next rank
//   data parallel
//     skip_bucket:PARAM      the bucket holding PARAM is not all_reduced
//     grad_sum:ROOT          a replicate() root's buckets are summed, not averaged
//     skip_buffer_broadcast  buffers are not broadcast (at construction, before each forward)
//     sync_ignored           ignored modules' gradients are averaged anyway
//     skip_reduce_scatter    a fully_shard unit's ranks keep their own rows of their own gradient
//     stale_param            a fully_shard unit reuses its first all_gather's parameters
//   training configurations
//     grad_scale:PARAM       the last rank's gradient of PARAM is scaled by 1.001 before the sync
//     clip_local_norm:*      clip_grad_norm uses each rank's local norm (its all_reduces skipped)
//     tied_grad:MODULE       MODULE's use of its (tied) weight adds nothing to the weight's gradient
//     loss_parallel_local:*  loss_parallel's max and sum-exp all_reduces are skipped
//     dropout_same_mask:FQN  a dropout draws its mask by local index (every tp rank the same mask)
//     recompute_mask:FQN     a dropout's mask in activation checkpointing's recompute is drawn anew
//   mixed precision
//     masters_rounded:*      the optimizer steps parameters rounded to param_dtype (no fp32 masters)
//     reduce_in_param_dtype:*  gradients are reduced in param_dtype, not reduce_dtype
#pragma once

#include "train/run.h"

namespace ptool {

struct Fault {
    std::string kind;
    std::string fqn;
    bool empty() const { return kind.empty(); }
    bool hits(const char* k, const std::string& where) const { return kind == k && (fqn == "*" || fqn == where); }
};

// "" or null: no fault; anything but KIND:FQN with a known KIND is an InputError listing them.
Fault parse_fault(const char* env);

// The layer that injects `fault` into a run (null for no fault).
std::unique_ptr<RunLayer> fault_layer(const Fault& fault);

}  // namespace ptool
