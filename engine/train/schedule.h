// A training step as a list of actions per pipeline rank, as torch.distributed.pipelining's
// schedules are: the forward and backward of microbatch m on stage s, the sends and receives that
// carry activations forward and their gradients back between stages, and once per step the
// data-parallel gradient sync, clip_grad_norm and the optimizer step. Run::step executes its rank's
// list (train/run.h); today's loop with gradient accumulation is the one-stage schedule
// F0 B0 F1 B1 ... sync clip step.
//
//   gpipe   every forward, then every backward (in microbatch order, as torch's ScheduleGPipe)
//   1f1b    stage s runs min(stages - s, m) forwards, then alternates one backward and one forward,
//           then the remaining backwards (torch's Schedule1F1B): at most stages - s microbatches
//           in flight
//   interleaved_1f1b
//           pp ranks hold v stages each, stage s on rank s mod pp (torch's and Megatron's loop
//           placement: rank r holds r, r + pp, ...). The compute order is torch's
//           ScheduleInterleaved1F1B (_get_1f1b_rank_ops with _get_warmup_ops, multiply_factor 2),
//           which for microbatches a multiple of pp (ptool's rule) is Megatron-Core's
//           forward_backward_pipelining_with_interleaving: rank r warms up with
//           min((v - 1) * pp + 2 * (pp - 1 - r), v * m) forwards, then alternates one forward and
//           one backward, then drains the backwards. Its k-th forward runs on its local stage
//           (k / pp) mod v (depth first: pp microbatches on one stage, then the next), its k-th
//           backward (k from 0 at its first) on local stage v - 1 - (k / pp) mod v; each stage
//           takes its microbatches in order. Its sends and receives are posted as Megatron-Core
//           posts them: between two units of compute (a warmup forward, a forward and a
//           backward, a cooldown backward) one batch of the sends of the unit before and the
//           receives of the unit after (torch's own runtime sends asynchronously; with
//           rendezvous sends placed next to each compute, two ranks would each wait in a send).
//           The bubble, in units of one stage's forward and backward, is (pp - 1) / (v * m) of
//           the step against 1f1b's (pp - 1) / m.
//
// Every stage's input comes from the stage before over p2p, but where both stages live on one rank
// (one pp rank holding every stage): the forward hands its output on and the backward its input's
// gradient back without a send. Rank pp - 1's stages but the last send on to rank 0's next stage.
//
// Backwards run in microbatch order in every schedule, so a parameter's gradient is accumulated
// in the same order as the one-stage loop's: the schedules give bitwise the same gradients.
// Sends are rendezvous (comm/communicator.h): consecutive sends and receives of a rank run as one
// batch_isend_irecv (as torch batches them), and check_schedule plays the lists against each
// other before anything runs, so a schedule that would deadlock is an error, not a hang.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/plan.h"  // ScheduleKind

namespace ptool {

enum class ActionKind {
    forward,          // stage's forward of microbatch m (the last stage: and the loss)
    backward,         // stage's backward of microbatch m (the last stage: from the loss)
    backward_input,   // "I": the backward's input gradient only (torch's BACKWARD_INPUT; sent on at once)
    backward_weight,  // "W": the weight gradients of an I run earlier (torch's BACKWARD_WEIGHT)
    send_forward,     // stage's output of m to stage + 1
    recv_forward,     // stage's input of m from stage - 1
    send_backward,    // stage's input gradient of m to stage - 1
    recv_backward,    // stage's output gradient of m from stage + 1
    grad_sync,        // data parallel's gradient sync (DDP's buckets; fully_shard reduced in backward)
    clip,             // clip_grad_norm_ over every stage's gradients
    optimizer_step,
};
const char* action_kind_name(ActionKind k);

struct Action {
    ActionKind kind;
    int stage = 0;
    int microbatch = 0;
    // DualPipeV's OVERLAP_F_B: this forward and the backward right after it in the list are one
    // torch action, whose two sub-actions torch's runtime runs one after the other unless a custom
    // function is registered for it; ptool runs them so and keeps the mark for the planner
    bool overlapped = false;
    bool is_p2p() const {  // send_forward .. recv_backward (a planner's critical path asks it per action)
        return kind >= ActionKind::send_forward && kind <= ActionKind::recv_backward;
    }
    bool is_backward() const {  // B, I or W: a part of a backward
        return kind == ActionKind::backward || kind == ActionKind::backward_input ||
               kind == ActionKind::backward_weight;
    }
    // "F2@1" (forward of microbatch 2 on stage 1), "I2@1", "W2@1", "SEND_F2@1", "SYNC", ...
    std::string str() const;
};

struct Schedule {
    ScheduleKind kind = ScheduleKind::accumulation;
    // the zero-bubble schedules (train/zero_bubble_schedule.h), which have no ScheduleKind yet:
    // torch's name for them ("ZBVZeroBubble", ...), which check_schedule's messages print
    std::string torch_name;
    int stages = 1;
    int microbatches = 1;
    // stage s runs on pipeline rank stage_rank[s]: s, or s mod pp under interleaved_1f1b (the loop
    // placement); the V schedules put stages s and 2 pp - 1 - s on rank s
    std::vector<int> stage_rank{0};
    std::vector<std::vector<Action>> ranks;  // per pipeline rank, in order

    int rank_of(int stage) const { return stage_rank.at(static_cast<size_t>(stage)); }
    std::vector<int> stages_of(int rank) const;  // the stages a rank holds, in increasing order
    // whether stage s's input comes from another rank (s > 0 and stage s - 1 lives elsewhere)
    bool receives_input(int s) const { return s > 0 && rank_of(s - 1) != rank_of(s); }
    // whether stage s's output goes to another rank
    bool sends_output(int s) const { return s + 1 < stages && rank_of(s + 1) != rank_of(s); }
};

// The one-stage loop: F0 B0 F1 B1 ... then sync, clip, step.
Schedule accumulation_schedule(int microbatches);
// A pipeline schedule over `stages` stages on stages / virtual_stages pipeline ranks (gpipe and 1f1b:
// one per rank; interleaved_1f1b: virtual_stages per rank, microbatches a multiple of the ranks):
// `rounds` of it one after the other (gradient accumulation around a pipeline, as torchtitan steps
// its schedule once per accumulation step), each over `microbatches` microbatches, then one sync,
// clip and step. The schedule's microbatches are numbered across the rounds (round r's are
// r*microbatches..).
Schedule pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds = 1,
                           int virtual_stages = 1);

// Which pp rank runs each of `stages` stages: the loop (s on rank s mod pp), or the V of zbv and
// dualpipev (stages s and 2 pp - 1 - s on rank s).
std::vector<int> stage_placement(ScheduleKind kind, int pp, int stages);

// pipeline_schedule, checked (check_schedule) once: every rank of a run and every simulated rank
// class builds the same one, so the last few are kept (a copy is returned).
Schedule checked_pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds = 1,
                                   int virtual_stages = 1);

// The action a p2p action meets on the peer stage: SEND_F m@s with RECV_F m@s+1, SEND_B m@s with
// RECV_B m@s-1 (and back).
Action p2p_partner(const Action& a);

// A send or receive's tag: the microbatch, the stage boundary it crosses (b between stages b and
// b + 1) and the direction, paired one-to-one (Cantor's pairing of microbatch and boundary), so
// messages between two ranks match whatever order they are posted in, however many stages' traffic
// the two ranks carry. With one boundary it is 2 * microbatch + direction.
int p2p_tag(const Action& a);

// Checks each rank's list against the schedule's definition before anything runs: a rank runs the
// actions of the stages it holds only (every stage on one rank), every microbatch's forward and
// backward exactly once per stage, a forward before its backward, a stage's input received before
// its forward and its output gradient before its backward (where the stage next to it lives on
// another rank; a local one's forward or backward before it otherwise), every send matched by the
// peer's receive; then plays the lists against each other with rendezvous
// sends (a rank's consecutive p2p actions completing together, as one batch) and throws
// RuntimeError naming the ranks, the action each waits in and the microbatch when they cannot
// all finish. InputError-free: a schedule is built by ptool; a broken one is a bug (exit 3).
// A stage's backward of m is one B or an I and a W (both once, never with a B): its I after its F,
// its W after its I, its receive of the output's gradient before and its send of the input's
// gradient after its B or I; a stage's Bs and Ws in microbatch order (a parameter's gradient
// accumulated in the one-stage loop's order, which bitwise equality across schedules rests on).
void check_schedule(const Schedule& s);
// `s` with stage `stage`'s I of `microbatch` (-1: of every microbatch) run as one whole backward at
// the I's place and its W dropped: the same gradients, bit for bit (verify's localisation of a
// split backward's W, verify/weight_probe.h).
Schedule unsplit(Schedule s, int stage, int microbatch);
// check_schedule and check_schedule_structure throw ScheduleViolation (core/error.h): a list that
// breaks the rules above (a W before its I, a microbatch's backward missing, a send no receive
// meets), its message naming the schedule, the rank, its stages and the action.
// check_schedule without playing the lists against each other: the rules of each rank's list alone
// (the zero-bubble schedules, train/zero_bubble_schedule.h, are checked so until ptool runs them).
void check_schedule_structure(const Schedule& s);

}  // namespace ptool
