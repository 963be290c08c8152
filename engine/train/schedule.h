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
    forward,        // stage's forward of microbatch m (the last stage: and the loss)
    backward,       // stage's backward of microbatch m (the last stage: from the loss)
    send_forward,   // stage's output of m to stage + 1
    recv_forward,   // stage's input of m from stage - 1
    send_backward,  // stage's input gradient of m to stage - 1
    recv_backward,  // stage's output gradient of m from stage + 1
    grad_sync,      // data parallel's gradient sync (DDP's buckets; fully_shard reduced in backward)
    clip,           // clip_grad_norm_ over every stage's gradients
    optimizer_step,
};
const char* action_kind_name(ActionKind k);

struct Action {
    ActionKind kind;
    int stage = 0;
    int microbatch = 0;
    bool is_p2p() const;
    std::string str() const;  // "F2@1" (forward of microbatch 2 on stage 1), "SEND_F2@1", "SYNC", ...
};

struct Schedule {
    ScheduleKind kind = ScheduleKind::accumulation;
    int stages = 1;
    int microbatches = 1;
    std::vector<std::vector<Action>> ranks;  // per pipeline rank (stage s on rank s), in order
};

// The one-stage loop: F0 B0 F1 B1 ... then sync, clip, step.
Schedule accumulation_schedule(int microbatches);
// A pipeline schedule over `stages` stages (one per pipeline rank): `rounds` of it one after the
// other (gradient accumulation around a pipeline, as torchtitan steps its schedule once per
// accumulation step), each over `microbatches` microbatches, then one sync, clip and step. The
// schedule's microbatches are numbered across the rounds (round r's are r*microbatches..).
Schedule pipeline_schedule(ScheduleKind kind, int stages, int microbatches, int rounds = 1);

// The action a p2p action meets on the peer stage: SEND_F m@s with RECV_F m@s+1, SEND_B m@s with
// RECV_B m@s-1 (and back).
Action p2p_partner(const Action& a);

// A send or receive's tag: the microbatch and the direction, so messages between two stages
// match whatever order they are posted in.
int p2p_tag(const Action& a);

// Checks each rank's list against the schedule's definition before anything runs: every
// microbatch's forward and backward exactly once per stage, a forward before its backward, a
// stage's input received before its forward and its output gradient before its backward, every
// send matched by the peer's receive; then plays the lists against each other with rendezvous
// sends (a rank's consecutive p2p actions completing together, as one batch) and throws
// RuntimeError naming the ranks, the action each waits in and the microbatch when they cannot
// all finish. InputError-free: a schedule is built by ptool; a broken one is a bug (exit 3).
void check_schedule(const Schedule& s);

}  // namespace ptool
