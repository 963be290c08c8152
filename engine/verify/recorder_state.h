// The Recorder behind record_run (verify/recorder.h), its concerns each in a file:
//   recorder.cpp           what is recorded when: construction, each step's tensors, resync
//   recorder_pieces.cpp    placement gathering: where this rank's piece sits in the whole, gathers
//   recorder_replicas.cpp  replica checks: whether a tensor's copies agree bitwise, per mesh dim
//   recorder_shadow.cpp    the shadow optimizer
//   recorder_relay.cpp     the stage relay: what rank 0 hears from the ranks and stages (queue, flush)
//   recorder_events.cpp    the observer: module events, compared at once or at the step's end
// Internal to those files: nothing else includes it.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/dim_collectives.h"
#include "model/optimizer.h"
#include "verify/compare.h"
#include "verify/keyed_gather.h"
#include "verify/recorder.h"

namespace ptool::recording {

inline Tensor on_host(const Tensor& t) {
    return t.device() == Device::cpu ? t : t.to_device(Device::cpu);
}

// The full size of dim `p.dim` from every rank's local size (uncounted metadata); an Owned tensor's
// whole shape from its owner.
Shape global_shape(const Shape& local, const Placement& p, Communicator& comm);

// A full tensor's digest, as the pieces of a sharded one add up to it (verify/digest.h).
uint64_t state_digest(const Tensor& full);

// Verification's own work inside a run (gathers, comparisons, the shadow optimizer): neither its
// collectives nor its tensors are the plan's, so neither is counted.
struct Unaccounted {
    CountingPaused comm;
    MemoryScope memory;
    explicit Unaccounted(CommCounter* c) : comm(c), memory(nullptr) {}
};

// Where this rank's piece of a tensor sits in the whole one: the box at `offset` of `shape`, and
// whether this rank counts it (one rank of each group of replicas does, or each its rows of it).
struct Box {
    std::vector<int64_t> offset;
    Shape shape;
    bool owner = true;
    int threads = 1;    // compare_piece's: more where one rank compares a replicated tensor alone
    Chunk rows{0, -1};  // the rows (dim 0) of the piece this rank compares; length -1: all
    // The part of this rank's piece it compares (its rows, or all of it) and where it starts in the whole
    Tensor part(const Tensor& piece) const {
        return rows.length < 0 ? piece : piece.narrow(0, rows.offset, rows.length);
    }
    std::vector<int64_t> part_offset() const {
        std::vector<int64_t> at = offset;
        if (rows.length >= 0) at[0] += rows.offset;
        return at;
    }
};

class Recorder {
public:
    Recorder(Run& run, const RecordOptions& opt);

    // recorder.cpp: the state after construction, each step's records, resync to the truth
    void construction(RunRecord& rec);
    void step(StepRecord& sr, const StepOutput& out, bool last_step);
    void resync(const StepRecord& sr);
    // recorder_shadow.cpp
    void start_shadow();
    // recorder_events.cpp
    StepObserver observer(StepRecord& sr);
    // recorder_replicas.cpp: which gradients' copies differ before clip_grad_norm scales them
    void before_clip(StepRecord& sr);

private:
    // recorder.cpp: a tensor recorded (gathered, or compared where it lies) and kept on rank 0
    void record_output(StepRecord& sr, const std::string& name, const std::vector<Placed>& outs,
                       bool last_step);
    Tensor record(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl,
                  bool ignored, bool last_step);
    Tensor keep(StepRecord& sr, const std::string& name, const Tensor& local, const Tensor& full,
                ReplicaState state, bool last_step);
    void keep_local(StepRecord& sr, const std::string& name, const Tensor& local, const Placements& pl,
                    ReplicaState state);

    // recorder_pieces.cpp: placement gathering
    Tensor gather(const Tensor& local, const Placements& pl);
    Tensor gather(const Placed& x);
    Shape whole_shape(const Shape& local, const Placements& pl) const;
    Box box_of(const Shape& whole, const Placements& pl) const;
    bool owns(const Placements& pl) const;
    // compare_piece's threads: all a comparison takes where this rank is the only one comparing a
    // piece of the tensor (the other ranks wait), else its own
    int threads(const Placements& pl) const { return owns(pl) && !pl.any_shard() ? compare_threads() : 1; }
    Box shared_box(const Shape& whole, const Placements& pl, ReplicaState state) const;
    Tensor piece_of(const Tensor& whole, const Placements& pl) const;
    void queue_digest(const std::string& name, const Tensor& local, const Placements& pl, ReplicaState state,
                      bool agree);
    Placements activation_placements(const Placed& x) const;
    const ContextShard* context() const;
    Tensor in_cp_order(const Tensor& whole) const;
    Box activation_box(const Shape& whole, const Placed& x) const;
    static DiffPiece piece(const Tensor& mine, const Tensor& expected, const Box& b, const Tolerance& tol);
    static DiffPiece bad_shape();

    // recorder_replicas.cpp: whether a tensor's replicas agree bitwise, over the data dims and over
    // the others (agreement), and the replica state recorded for it
    struct Agreement {
        bool model = true, data = true;
        bool replicas = false;  // replicated over some dim of more than one rank
    };
    Agreement agreement(const Tensor& local, const Placements& pl);
    static std::map<int, std::vector<int>> group_firsts(const Run& run);
    ReplicaState replica_state(const Tensor& local, const Placements& pl, bool ignored);

    // recorder_shadow.cpp: the shadow optimizer's step from the run's gradients, and the parameters
    // compared with it
    void shadow_grad(size_t i, const Parameter& p, const Tensor& recorded);
    void shadow_step();
    void shadow_compare(StepRecord& sr, const std::string& key, size_t i, const Parameter& p,
                        const Tensor& recorded);

    // recorder_relay.cpp: what rank 0 hears from the ranks, by key (verify/keyed_gather.h): queued,
    // the step's entries travel together at its end (flush), not one collective each (eight rank
    // threads taking turns on two cores spent a third of a verify's comparison phase handing the
    // cores round for them). Ranks may queue different lists (pipeline stages hold different
    // tensors): rank 0 merges by key, in rank order, and the key says where the result goes.
    enum class Target {
        reference,      // a piece of a comparison with the reference's tensor: vs_reference[name]
        golden,         // ... with the golden file's: vs_golden[name]
        shadow,         // ... with the shadow optimizer's parameter: vs_shadow[name]
        event,          // ... with the reference's module event: the event keyed `name`
        state,          // a tensor's ReplicaState (from its stage's leader): replicas[name]
        digest,         // a piece's state digest sum (construction): init_state[name]
        unique_params,  // a stage's count of unique parameters (construction)
        tensor,         // another stage's whole tensor and its ReplicaState, compared by rank 0 (mpirun)
        event_tensor,   // another stage's whole module event, compared by rank 0 (mpirun)
    };
    void queue(Target t, const std::string& name, std::vector<int64_t> words);
    void queue_diff(Target t, const std::string& name, const DiffPiece& piece);
    Tolerance tolerance(Target t, const std::string& name) const;
    void note_state(StepRecord& sr, const std::string& name, ReplicaState state);
    void flush(StepRecord* sr);
    void send_whole(StepRecord& sr, const std::string& name, const Tensor& full, ReplicaState state);
    void resync_stages(const std::string& prefix,
                       const std::unordered_map<std::string, const Tensor*>& truth);

    // recorder_events.cpp: the step's module events
    void add_event(StepRecord& sr, ModuleEvent e);
    ModuleEvent& event_of(StepRecord& sr, const std::string& key);
    const StepRecord* reference_step(int64_t step) const;
    const ModuleEvent* reference_event(int64_t step, const std::string& key);
    void compare_deferred(StepRecord& sr, const StepRecord* ref_step);

    Communicator& tp() const { return run_.comm(DimRole::tp); }
    // A pipeline run (its stages hold different tensors): what rank 0 compares whole reaches it from
    // each stage's leader at the flush (verify/keyed_gather.h), and the shadow optimizer steps
    // each rank's own pieces.
    bool staged() const { return run_.stages() > 1; }
    bool piecewise_shadow() const { return local_ || staged(); }
    // loss_normalization global_tokens: each rank's loss is its part of the step's sum / count
    bool summed_loss() const {
        return run_.plan().normalization(run_.model()) == LossNormalization::global_tokens;
    }

    Run& run_;
    const RecordOptions& opt_;
    std::vector<std::pair<std::string, ParamPtr>> shadow_;
    std::unique_ptr<Optimizer> shadow_opt_;
    const bool rank0_;
    Communicator& data_;  // the batch's group: activations' rows, the loss
    std::vector<int> order_;
    std::unordered_map<std::string, const Tensor*> reference_, golden_;
    const bool local_;
    bool leader_ = false;  // coordinate 0 on every dim but pp: speaks for its stage (rank 0 without pp)
    std::map<int, std::vector<int>> group_first_;  // group_firsts()
    // A module event kept for comparison at the step's end (RecordOptions::follow): its key, this
    // rank's piece (rank-local: undefined on a rank that does not count it) or rank 0's gathered
    // tensor, with the layout and shape it had.
    struct Deferred {
        std::string key;
        Placed x;
        Shape shape;
        bool local;
    };
    std::vector<Deferred> deferred_;
    std::vector<KeyedEntry> queue_;                        // for rank 0, sent at the next flush
    std::unordered_map<std::string, size_t> event_index_;  // rank 0: the step's events by key
    const StepRecord* ref_events_of_ = nullptr;            // the reference step ref_events_ indexes
    std::unordered_map<std::string, const ModuleEvent*> ref_events_;
    RunRecord* init_ = nullptr;                           // construction's record (flush)
    std::unordered_map<std::string, size_t> init_index_;  // rank 0: init_state's index by name
    std::set<std::string> init_differ_;                   // rank 0: state whose replicas differ
};

}  // namespace ptool::recording
