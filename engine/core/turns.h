// Turns on shared cores. Rank threads that outnumber the cores take turns on them (comm/
// comm_threads.h CoreSlots): a rank holds a core while it computes and gives it back while it waits
// in a collective. A plan whose ranks compute long stretches without a collective (DDP's forward
// and backward: its all_reduces come after) would then run them one rank after another, and the
// last rank's stretch would run alone at the end, a core idle beside it. take_turn() is the point
// between two pieces of such a stretch (every module's forward and backward) where a thread that
// has held its core for a quantum, while another waits for one, hands it to the longest waiting and
// queues behind: the ranks advance together, as on their own devices. Nothing a rank computes
// depends on it.
#pragma once

namespace ptool {

class TurnTaker {
public:
    virtual void take_turn() = 0;  // hands this thread's core to a waiting thread, if any, and waits for one

protected:
    ~TurnTaker() = default;
};

// The cores this thread takes turns on while it holds one (null: it does not share)
void set_thread_turns(TurnTaker* turns);
// This thread just got a core: its quantum starts now
void turn_started();
// Between two pieces of a computation: a turn to the others after a quantum (10 ms) on the core
void take_turn();

}  // namespace ptool
