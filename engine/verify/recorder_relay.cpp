// The stage relay for the Recorder (verify/recorder_state.h): what rank 0 hears from the ranks and
// the pipeline stages' leaders, queued by key and merged at the flush (verify/keyed_gather.h), and
// resync of a pipeline whose truth is rank 0's.
#include <algorithm>

#include "verify/digest.h"
#include "verify/recorder_state.h"

namespace ptool::recording {

void Recorder::queue(Target t, const std::string& name, std::vector<int64_t> words) {
    queue_.push_back({fmt::format("{}|{}", static_cast<int>(t), name), std::move(words), 0});
}

void Recorder::queue_diff(Target t, const std::string& name, const DiffPiece& piece) {
    std::vector<int64_t> words(kPieceWords);
    pack_piece(piece, words.data());
    queue(t, name, std::move(words));
}

Tolerance Recorder::tolerance(Target t, const std::string& name) const {
    return t == Target::shadow  ? opt_.tol.for_masters()
           : t == Target::event ? opt_.tol
                                : rule_for(opt_.tol, name);
}

// A tensor's replica state, on rank 0: its own, or (pipeline) heard from the stage's leader.
void Recorder::note_state(StepRecord& sr, const std::string& name, ReplicaState state) {
    if (rank0_)
        sr.replicas[name] = state;
    else if (run_.stages() > 1 && leader_)
        queue(Target::state, name, {static_cast<int64_t>(state)});
}

// Collective over the world: rank 0 merges every rank's queued entries by key and puts each
// result where its key says (sr: the step's; null: construction's, into init_).
void Recorder::flush(StepRecord* sr) {
    // to rank 0 alone (p2p), the only rank that reads them: an all_gather gave every rank every
    // rank's entries, a host's memory growing with the square of the ranks (tp=256 of a 346-weight
    // MLP: 3.2 GB, 105 MB now; tp=1024 killed by the OOM killer)
    std::vector<KeyedEntry> entries = gather_keyed_to_root(run_.world(), queue_);
    queue_.clear();
    if (!rank0_) return;
    struct Merged {
        Target target;
        std::string name;
        DiffPiece piece;
        uint64_t hash = 0;
        std::vector<int64_t> words;  // the first entry's
        bool differ = false;
    };
    std::vector<Merged> merged;
    std::unordered_map<std::string, size_t> at;
    for (KeyedEntry& e : entries) {
        auto [it, fresh] = at.emplace(e.key, merged.size());
        if (fresh) {
            const size_t bar = e.key.find('|');
            merged.push_back({static_cast<Target>(std::stoi(e.key.substr(0, bar))),
                              e.key.substr(bar + 1),
                              {},
                              0,
                              {},
                              false});
            Merged& m = merged.back();
            if (m.target == Target::tensor || m.target == Target::event_tensor) {
                m.words = std::move(e.words);  // one stage's leader sends each
                continue;
            }
            m.words = e.words;
        }
        Merged& m = merged[it->second];
        switch (m.target) {
            case Target::digest:
                m.hash += static_cast<uint64_t>(e.words[0]), m.differ = m.differ || e.words[2] == 0;
                break;
            case Target::unique_params:
                init_->unique_params += e.words[0];
                break;
            case Target::state:  // noted again (the loss: combined from each data rank's own): the last
                m.words = e.words;
                break;
            case Target::tensor:
            case Target::event_tensor:
                PTOOL_REQUIRE(false, "'{}' sent to rank 0 twice", e.key);
                break;
            default:
                merge_piece(m.piece, unpack_piece(e.words.data()));
        }
    }
    for (Merged& m : merged) {
        switch (m.target) {
            case Target::reference:
                sr->vs_reference[m.name] = finish_diff(m.piece, tolerance(m.target, m.name));
                break;
            case Target::golden:
                sr->vs_golden[m.name] = finish_diff(m.piece, tolerance(m.target, m.name));
                break;
            case Target::shadow:
                sr->vs_shadow[m.name] = finish_diff(m.piece, tolerance(m.target, m.name));
                break;
            case Target::event:
                event_of(*sr, m.name).diff = finish_diff(m.piece, tolerance(m.target, m.name));
                break;
            case Target::state:
                sr->replicas[m.name] = static_cast<ReplicaState>(m.words[0]);
                break;
            case Target::digest: {
                auto it = init_index_.find(m.name);
                if (it == init_index_.end())  // another stage's
                    it = init_index_.emplace(m.name, init_->init_state.size()).first,
                    init_->init_state.emplace_back(m.name, 0);
                const Shape whole(m.words.begin() + 3, m.words.end());
                init_->init_state[it->second].second =
                    finish_element_hash(m.hash, static_cast<DType>(m.words[1]), whole);
                if (m.differ) init_differ_.insert(m.name);
                break;
            }
            case Target::unique_params:
                break;
            case Target::tensor:
                keep(*sr, m.name, Tensor(), tensor_from_words(m.words.data() + 1, m.words.size() - 1),
                     static_cast<ReplicaState>(m.words[0]), false);
                break;
            case Target::event_tensor: {
                const Tensor full = tensor_from_words(m.words.data(), m.words.size());
                ModuleEvent& e = event_of(*sr, m.name);
                if (!opt_.compare_with)
                    e.full = full;
                else if (const ModuleEvent* ref = reference_event(sr->step, m.name))
                    e.diff = compare_tensors(full, ref->full, opt_.tol);
                break;
            }
        }
        std::vector<int64_t>().swap(m.words);  // a whole tensor's words, done with
    }
}

// Another stage's whole tensor for rank 0, sent by the stage's leader at the flush (its words:
// the replica state, then the tensor's); rank 0's own stage's, kept at once.
void Recorder::send_whole(StepRecord& sr, const std::string& name, const Tensor& full, ReplicaState state) {
    if (rank0_) {
        keep(sr, name, Tensor(), full, state, false);
        return;
    }
    if (!leader_) return;
    std::vector<int64_t> words{static_cast<int64_t>(state)};
    const std::vector<int64_t> t = tensor_words(on_host(full));
    words.insert(words.end(), t.begin(), t.end());
    queue(Target::tensor, name, std::move(words));
}

// resync for a pipeline whose truth is rank 0's (mpirun): rank 0 broadcasts the step's
// parameters of the truth by name (every stage's, the ignored modules' excepted), and each rank
// cuts its pieces of its own. Collective over the world.
void Recorder::resync_stages(const std::string& prefix,
                             const std::unordered_map<std::string, const Tensor*>& truth) {
    std::vector<KeyedEntry> sent;
    if (rank0_) {
        std::vector<std::string> names;  // in name order: what travels does not follow a hash's order
        for (const auto& [name, t] : truth)
            if (name.compare(0, prefix.size(), prefix) == 0 && !run_.ignored(name.substr(prefix.size())))
                names.push_back(name);
        std::sort(names.begin(), names.end());
        for (const std::string& name : names)
            sent.push_back({name, tensor_words(on_host(*truth.at(name))), 0});
    }
    std::unordered_map<std::string, Tensor> whole;
    for (const KeyedEntry& e : broadcast_keyed(run_.world(), sent))
        whole.emplace(e.key, tensor_from_words(e.words.data(), e.words.size()));
    const auto params = run_.model().named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
        const auto& [name, p] = params[i];
        if (run_.ignored(name)) continue;
        auto it = whole.find(prefix + name);
        PTOOL_REQUIRE(it != whole.end(), "resync of '{}': the truth has no {}", name, prefix + name);
        const Placements pl = run_.placements(p.get());
        const Tensor piece = piece_of(it->second, pl).to(p->value.dtype());
        PTOOL_REQUIRE(piece.shape() == p->value.shape(), "resync of '{}': {} for {}", name,
                      shape_str(piece.shape()), shape_str(p->value.shape()));
        if (!shadow_.empty()) shadow_[i].second->value = piece.clone();
        run_.backend().copy(p->value.device() == Device::cpu ? piece : piece.to_device(p->value.device()),
                            p->value);
    }
}

}  // namespace ptool::recording
