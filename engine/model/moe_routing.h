// A mixture of experts' router, on the host: which experts each token goes to and with what
// weight, from the router's logits, and the logits' gradient from the weights' gradient. The
// families differ in three choices (transformers' modeling files):
//
//   Mixtral        softmax over the experts, top-k, the k weights renormalised to sum to 1
//   Qwen2-MoE      softmax, top-k, the k weights as they are (norm_topk_prob: false)
//   Qwen3-MoE      softmax, top-k, renormalised (norm_topk_prob: true)
//   DeepSeek-V3    sigmoid scores; top-k of score + a bias that only selects
//                  (e_score_correction_bias); the k scores renormalised, times routed_scaling_factor
//
// Scores are computed in float64 from the logits (transformers computes them in float32: the two
// agree to the rounding verify's tolerance allows). Ties in the selection go to the lower expert
// index. Routing is data-dependent control flow: a GPU run copies the logits to the host, as
// transformers' loop over experts syncs on each expert's token count.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace ptool {

enum class RouterScore { softmax, sigmoid };

struct RouterOptions {
    int64_t experts = 1, top_k = 1;
    RouterScore score = RouterScore::softmax;
    bool norm_topk_prob = true;  // the k weights divided by their sum
    double scaling = 1.0;        // routed_scaling_factor: the weights times it (DeepSeek-V3)
};

struct Routing {
    int64_t tokens = 0;
    std::vector<double> scores;   // [tokens, experts]: softmax or sigmoid of the logits
    std::vector<int64_t> chosen;  // [tokens, k]: the experts, best first
    std::vector<double> weights;  // [tokens, k]: what each chosen expert's output is multiplied by
    // Per expert, the slots (token * k + j) routed to it, in token order: its tokens' rows.
    std::vector<std::vector<int64_t>> slots;
};

// From the logits [tokens, experts] (row-major) and the selection bias (empty: none).
Routing route(const RouterOptions& o, const std::vector<double>& logits, const std::vector<double>& bias);

// Routing's per-expert slots from its chosen experts (after `chosen` was set from elsewhere).
void assign_slots(const RouterOptions& o, Routing& r);

// Balanced routing without values (meta tensors: explain): token n's slot j goes to expert
// (n k + j) mod experts, weight 1/k, so every expert gets tokens x k / experts of them (+-1).
Routing balanced_routing(const RouterOptions& o, int64_t tokens);

// The logits' gradient [tokens, experts] from the weights' gradient [tokens, k]: through the
// scaling, the renormalisation and the score function (the bias selects: it has no gradient).
std::vector<double> route_backward(const RouterOptions& o, const Routing& r,
                                   const std::vector<double>& d_weights);

// What a moe layer routes with: route and route_backward. A layer takes it as a dependency
// (Moe::set_router), so verification's fault layer can hand one a router with a bug in it.
class Router {
public:
    virtual ~Router() = default;
    virtual Routing route(const RouterOptions& o, const std::vector<double>& logits,
                          const std::vector<double>& bias) const {
        return ptool::route(o, logits, bias);
    }
    virtual std::vector<double> backward(const RouterOptions& o, const Routing& r,
                                         const std::vector<double>& d_weights) const {
        return route_backward(o, r, d_weights);
    }
    // Whether the load-balancing loss's statistics are summed over every rank that routes its own
    // tokens (model/moe.h) before the loss is taken: true.
    virtual bool reduces_balance() const { return true; }
};

// Whether token n's chosen set could change if each of its logits moved by up to tol(l) = atol +
// rtol |l| (verify's tolerance on the router's logits): the lowest selection key a chosen expert can
// take is at most the highest an unchosen one can. Keys: the logit itself under softmax without a
// bias (softmax keeps the logits' order); sigmoid(l) + bias, monotone in l; a softmax score + bias,
// within s e^(+-(tol_i + max tol)) (the numerator and the sum move by e^(+-tol) at most).
bool near_tie(const RouterOptions& o, const Routing& r, int64_t n, const std::vector<double>& logits,
              const std::vector<double>& bias, double rtol, double atol);
// Token n routed to `chosen` (k experts, the reference's), its weights from its own scores as the
// router gives them: the router run on the token alone with a selection bias that forces the set.
void force_choice(const Router& router, const RouterOptions& o, Routing& r, int64_t n,
                  const std::vector<double>& logits, const std::vector<double>& bias, const int64_t* chosen);

// How a moe layer lays out its tokens for expert parallelism (parallel/expert_parallel.h): which
// expert's rows go to a rank as the l-th of its experts, how they are counted, and whether the
// combine puts each row back at its token. A dependency, so fault injection can swap in a buggy one.
class ExpertDispatch {
public:
    virtual ~ExpertDispatch() = default;
    // The expert whose rows go to ep rank `rank` as its l-th (it owns experts rank x per_rank ..).
    virtual int64_t sent_as(int rank, int64_t l, int64_t per_rank, int /*ranks*/) const {
        return rank * per_rank + l;
    }
    // The rows counted per send position (rank x per_rank + l), as they go out: as they are.
    virtual void count(std::vector<int64_t>& /*per_position*/, int64_t /*per_rank*/) const {}
    // Whether the combine puts each returned row back at its token (inverts the dispatch's permutation).
    virtual bool inverts() const { return true; }
};

}  // namespace ptool
