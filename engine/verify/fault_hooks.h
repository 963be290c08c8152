// The fault layer's module hooks, routers and expert dispatch (verify/faults.cpp installs them):
// each breaks one thing a style, an attention under context parallel, a selective-checkpoint region,
// a pipeline stage's input or a mixture of experts does, as a fault class of verify/faults.h says.
// Internal to verify/faults*.cpp.
#pragma once

#include <memory>

#include "model/module.h"
#include "model/moe_routing.h"
#include "verify/faults.h"

namespace ptool::faults {

// A style's hooks (`inner`) with one of its reductions broken (skip_all_reduce, bias_every_rank,
// skip_grad_all_reduce) over `parts` tp ranks.
std::shared_ptr<ModuleHooks> style_fault_hooks(std::shared_ptr<ModuleHooks> inner, FaultKind kind, int parts);
// A module's own computation broken: tied_grad, dropout_same_mask, recompute_mask, cp_balance_noncausal.
std::shared_ptr<ModuleHooks> module_fault_hooks(FaultKind kind);
// An attention under context parallel: cp_position_offset, cp_permutation_kept, cp_mask_unshifted,
// cp_merge_unscaled.
std::shared_ptr<ModuleHooks> context_fault_hooks(FaultKind kind);
// sac_stale_output: an op's kept output reused from the previous microbatch.
std::shared_ptr<ModuleHooks> stale_kept_hooks();
// pp_stale_activation: a stage's input buffer reused.
std::shared_ptr<ModuleHooks> stale_input_hooks();
std::shared_ptr<Router> unnormalised_router();   // moe_router_unnormalised
std::shared_ptr<Router> local_balance_router();  // moe_aux_unreduced
// ep_split_sizes, ep_combine_unpermuted, ep_expert_misplaced
std::shared_ptr<ExpertDispatch> fault_dispatch(FaultKind kind);

}  // namespace ptool::faults
