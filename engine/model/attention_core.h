// What a module that attends over the sequence offers the rest of ptool (Module::attention_core()):
// activation checkpointing, explain's context-parallel traffic and the fault layer ask for it
// instead of casting to a concrete attention, so a second kind of attention implements this and
// everything that reads attention follows (as model/routed_experts.h does for experts).
#pragma once

namespace ptool {

class AttentionCore {
public:
    // attn_implementation flash: q, k and v kept, scores recomputed in backward (model/blocks.h)
    virtual bool flash() const = 0;
    virtual bool causal() const = 0;
    // The mask, switched for a call (fault injection's cp_balance_noncausal).
    virtual void set_causal(bool on) = 0;
    // Megatron's selective recompute of the core (core_attn): eager attention keeps q, k and v and
    // recomputes its probabilities in backward.
    virtual void set_recompute_core(bool on) = 0;

protected:
    ~AttentionCore() = default;
};

}  // namespace ptool
