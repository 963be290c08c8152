// Tensor-parallel styles as module hooks, as PyTorch's ColwiseParallel / RowwiseParallel /
// PrepareModuleInput(Output) install forward hooks. Between modules activations are plain local
// tensors (use_local_output). Invariant: a gradient has the placement its tensor had in the
// forward (Partial -> Replicate), so each hook's backward knows its gradient's placement from its
// own forward, even where modules fan out (attention's q/k/v). TpState tracks the placement of
// the latest activation and gradient only for observers that gather them to full size.
//
//   colwise (Megatron's ColumnParallelLinear): weight Shard(0), bias Shard(0).
//     in: input_layouts (Replicate) -> Replicate; out: Shard(-1) -> output_layouts (Shard(-1)).
//     backward: the input gradient is Partial -> all_reduce (Megatron's f: copy fwd, all-reduce bwd).
//   rowwise (RowParallelLinear): weight Shard(1), bias Replicate, added once after the reduction.
//     in: input_layouts (Shard(-1)) -> Shard(-1); out: Partial -> output_layouts (Replicate:
//     all_reduce, Megatron's g; Shard(0): reduce_scatter).
//   prepare_input / prepare_output / prepare_input_output: redistribute only.
//   embedding colwise: weight Shard(1), output Shard(-1); rowwise (vocab-parallel): weight
//     Shard(0), each rank looks up its ids, output Partial -> output_layouts (Replicate).
//   sequence_parallel (norms, dropout): activations Shard(1); parameter gradients all_reduced.
#pragma once

#include <map>
#include <memory>

#include "model/model.h"
#include "parallel/plan.h"
#include "parallel/redistribute.h"

namespace ptool {

// Bugs injected on purpose (PTOOL_FAULT=kind:fqn, fqn * for every place) to prove that verify
// catches and localises them. Tensor parallel: skip_all_reduce, bias_every_rank,
// skip_grad_all_reduce, wrong_shard_dim, wrong_shard_offset (module FQNs), wrong_src_rank.
// Data parallel: skip_bucket (the bucket holding a parameter FQN), grad_sum (summed, not
// averaged), skip_buffer_broadcast, sync_ignored (ignored modules averaged anyway),
// skip_reduce_scatter and stale_param (fully_shard unit FQNs).
struct Fault {
    std::string kind;
    std::string fqn;
    bool hits(const char* k, const std::string& where) const { return kind == k && (fqn == "*" || fqn == where); }
};
Fault parse_fault(const char* env);

// Overwrites a tensor that a broadcast is about to replace with values no correct run produces
// (rank-dependent), so that a broadcast that is skipped or sent from the wrong rank is caught.
void poison_replica(Tensor& t, int rank);  // "" or null: no fault; a bad value is an InputError

struct TpState {
    Communicator* comm = nullptr;  // the tensor-parallel mesh dim
    Placement act = Placement::replicate();   // of the activation flowing forward
    Placement grad = Placement::replicate();  // of the gradient flowing backward
    std::map<const Parameter*, Placement> param_placement;  // sharded parameters; the rest are Replicate
    Fault fault;
};

std::shared_ptr<ModuleHooks> make_style_hooks(const StyleSpec& spec, Module& module, std::shared_ptr<TpState> state);

// Full size of a tensor placed as p, from local sizes (exchanged, uncounted, when p is a Shard).
Shape global_shape(const Tensor& local, const Placement& p, Communicator& comm);

}  // namespace ptool
