// torch.distributed.pipelining's zero-bubble schedules as ptool Schedules (docs/zero_bubble.md):
// each backward split into an input gradient I (sent upstream at once) and a weight gradient W
// (deferred into the bubble), in the per-rank orders of torch's generators at
// 00722e648b740f91d0e71494baa17891749fd291, which tools/zero_bubble_orders.py ports line by line:
//
//   interleaved_zero_bubble_schedule
//           ScheduleInterleavedZeroBubble ("ZB1P"; with one stage per rank the paper's ZB-H1): pp
//           ranks of virtual_stages stages each, stage s on rank s mod pp (the loop placement), the
//           order of _get_1f1b_rank_ops(enable_zero_bubble=True): warmup forwards (one fewer per
//           rank than interleaved 1F1B's), then F I [W], then I [W], each W the oldest pending
//           one once `rank` Is are pending, then the remaining Ws
//   zbv_zero_bubble_schedule
//           ScheduleZBVZeroBubble (arXiv 2401.10241 section 6): two stages per rank in the V,
//           stages s and 2 pp - 1 - s on rank s
//   dualpipev_schedule
//           ScheduleDualPipeV (DeepSeek's DualPipe folded into the V): its OVERLAP_F_B(F, B) is
//           the two actions F (marked Action::overlapped) and B in that order, which is what
//           torch's runtime runs unless a custom function is registered for OVERLAP_F_B
//
// The lists are torch's compute-only orders, torch's idle slots (None) dropped (they only time the
// lists: _add_bubbles_to_actions inserts nothing else), with the sends and receives torch's lowering
// adds (_add_send_recv: a send right after the action it carries the result of, the peer's receive
// appended to the peer's list at that moment), and the step's SYNC CLIP STEP at the end. One round:
// no gradient accumulation around them yet.
//
// They are ScheduleKind zero_bubble, zbv and dualpipev (a plan's `schedule:`), run by Run's split
// backward (model/module.h weight_work). check_schedule_structure checks them; check_schedule's rendezvous
// play also finishes on every shape the tests try (docs/zero_bubble.md 3.6's deadlock is of add_units'
// Megatron batching, not of torch's placement of the sends and receives), which is observed, not proven for
// all shapes.
#pragma once

#include <vector>

#include "train/schedule.h"

namespace ptool {

// The V placement (torch's generate_stage_to_rank_mapping(pp, 2 pp, style="v")): stage s and
// stage 2 pp - 1 - s on rank s.
std::vector<int> v_stage_rank(int pp);

// The three schedules over pp pipeline ranks of virtual_stages stages each and `microbatches`
// microbatches. Torch's argument checks are InputErrors in torch's words: the interleaved one needs
// microbatches a multiple of its rounds (max(1, microbatches / pp)); ZBV and DualPipeV exactly two
// stages per rank; DualPipeV at least as many microbatches as stages (2 pp).
Schedule interleaved_zero_bubble_schedule(int pp, int virtual_stages, int microbatches);
Schedule zbv_zero_bubble_schedule(int pp, int virtual_stages, int microbatches);
Schedule dualpipev_schedule(int pp, int virtual_stages, int microbatches);

}  // namespace ptool
