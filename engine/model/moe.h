// A mixture-of-experts layer (transformers' MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock,
// Qwen3MoeSparseMoeBlock, DeepseekV3MoE): a router picks top_k of `experts` gated MLPs per token
// (model/moe_routing.h), each token's output is its experts' outputs weighted by the router, plus
// an optional shared expert every token goes through (Qwen2-MoE's, gated by sigmoid(
// shared_expert_gate(x)); DeepSeek's, ungated). Dropless: every expert takes every token routed to it.
//
//   logits = gate(x) [N, E];  (experts, weights) = route(logits)
//   y = sum over the token's k experts e of  w_e * experts.e(x)   (+ shared_expert(x) * g)
//
// Children by transformers' names: gate (linear dim -> experts, no bias), experts.0 ..
// experts.E-1 (gated_mlp: gate_proj, up_proj, down_proj), shared_expert, shared_expert_gate; the
// buffer e_score_correction_bias (selection_bias: zeros, as transformers registers it).
//
// Every expert is called on every microbatch, with the rows routed to it (none is a [1, 0, dim]
// call): hooks that run per module (DDP's buckets, fully_shard's units) see the same calls on every
// rank. An expert's rows are another set of tokens on each data-parallel rank, so it reports its
// output and input gradient put back at its tokens' places ([.., dim], zero elsewhere) and nothing
// from inside it: verify compares the router's logits, the routing (sub_event "routing weights":
// each token's weight per expert, 0 where not chosen), each expert and this layer's output token
// by token.
#pragma once

#include "model/blocks.h"
#include "model/microbatch_stack.h"
#include "model/moe_routing.h"
#include "model/routed_experts.h"

namespace ptool {

class Moe : public Module, public RoutedExperts {
public:
    struct Options {
        int64_t dim = 0, hidden = 0;
        RouterOptions router;
        bool selection_bias = false;  // e_score_correction_bias (DeepSeek-V3)
        int64_t shared_hidden = 0;    // the shared expert's hidden size; 0: none
        bool shared_gate = false;     // Qwen2-MoE's sigmoid gate on the shared expert
        // The load-balancing loss's coefficient (0: none): Switch Transformer's, as Megatron's
        // switch_load_balancing_loss_func computes it per layer over the tokens of every data rank
        double aux_loss_coef = 0;
        // Capacity-factor routing (0: dropless): each expert takes at most ceil(capacity_factor x T x
        // top_k / experts) of the microbatch's T tokens' slots, first come first served in token order
        double capacity_factor = 0;
        Activation act = Activation::silu;
    };
    Moe(std::string name, SourceLocation where, const Options& o, DType dtype);
    Shape output_shape(const Shape& in) const override;
    // Tokens are routed whole, the same tokens on every tensor-parallel rank: Replicate over tp (a
    // batch or sequence shard is exit 2 with torchtitan's fix, prepare_input to replicate); the gate's
    // output (the router's logits) as the input, every expert's and the shared expert's ending whole.
    Layout layout(LayoutVisitor& v, const Layout& in) const override;
    void init_params(uint64_t seed) override;
    const Options& options() const { return o_; }
    RoutedExperts* routed_experts() override { return this; }
    // RoutedExperts
    const RouterOptions& router_options() const override { return o_.router; }
    int64_t token_dim() const override { return o_.dim; }
    double aux_loss_coef() const override { return o_.aux_loss_coef; }
    double capacity_factor() const override { return o_.capacity_factor; }
    void set_router(std::shared_ptr<const Router> r) override { router_ = std::move(r); }
    void set_dispatch(std::shared_ptr<const ExpertDispatch> d) override { dispatch_ = std::move(d); }
    Module& expert(int64_t e) const override {
        return *children()[1].second->children()[static_cast<size_t>(e)].second;
    }

protected:
    Placed forward_placed(RunContext& ctx, const Placed& x) override;
    Placed backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) override;

private:
    Linear& gate() const { return static_cast<Linear&>(*children()[0].second); }
    Module* shared() const { return o_.shared_hidden ? children()[2].second.get() : nullptr; }
    Linear* shared_gate() const {
        return o_.shared_gate ? static_cast<Linear*>(children()[3].second.get()) : nullptr;
    }
    // Expert parallel (parallel/expert_parallel.h): this rank's tokens in send order (by expert, so
    // grouped by owner), what each rank sends and receives, and on the owner each owned expert's
    // rows among those received.
    struct Dispatch {
        Tensor ids, weights;          // [S]: the send rows' tokens; [S, dim]: their router weights
        Tensor combine_ids;           // [S]: where the combine puts each row (ids: its token)
        std::vector<int64_t> offset;  // per expert: where its rows start among the send rows
        std::vector<int64_t> slots;   // each send row's slot (token x k + j)
        std::vector<int64_t> send_rows, recv_rows;  // per ep rank
        std::vector<Tensor> owned_ids;              // per owned expert: its rows among the received ones
        Tensor outputs;                             // [S, dim]: the experts' outputs, back in send order
    };
    struct Saved {
        Routing routing;
        std::vector<Tensor> outputs;  // each expert's output on its rows, before the weights
        Dispatch ep;
        std::vector<double> aux_grad;  // d(the balancing loss)/d(each expert's score), scaled; empty: none
        Tensor shared_out, shared_g;   // the shared expert's output and its gate's sigmoid [N, 1]
    };
    // The routed experts' part of the output (added into out [N, dim]), and its backward (added
    // into dx): each expert on its rows here, or under expert parallelism on its owner's.
    void balance_loss(RunContext& ctx, Saved& sv, Device dev) const;
    void drop_over_capacity(RunContext& ctx, Saved& sv, Device dev) const;
    void follow_reference(RunContext& ctx, const Placed& x, const std::vector<double>& logits,
                          const std::vector<double>& bias, Routing& r) const;
    using Observer = std::function<void(const std::string&, Phase, int, const Placed&)>;
    void experts_forward(RunContext& ctx, const Placed& x, Saved& sv, Tensor& out, const Observer& observer);
    void experts_backward(RunContext& ctx, const Placed& dy, Saved& sv, Tensor& dx,
                          std::vector<double>& d_weights, const Observer& observer);
    void dispatched_forward(RunContext& ctx, const Placed& x, Saved& sv, Tensor& out,
                            const Observer& observer);
    void dispatched_backward(RunContext& ctx, const Placed& dy, Saved& sv, Tensor& dx,
                             std::vector<double>& d_weights, const Observer& observer);
    Options o_;
    std::shared_ptr<const Router> router_;
    std::shared_ptr<const ExpertDispatch> dispatch_;
    MicrobatchStack<Saved> saved_;
};

// The parameters a token does not use: for every moe under root, (experts - top_k) experts'
// (a Mixtral-8x7B's 46.7B parameters hold 12.9B active per token).
int64_t inactive_parameters(const Module& root);

}  // namespace ptool
