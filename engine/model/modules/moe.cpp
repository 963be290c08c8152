// moe: a mixture-of-experts layer (model/moe.h), its routing on the host (model/moe_routing.h).
#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "comm/comm_stats.h"
#include "comm/communicator.h"
#include "core/memory_account.h"
#include "model/layers.h"
#include "model/module_type.h"
#include "model/modules/moe_rows.h"
#include "model/routing_log.h"

namespace ptool {

using namespace moe_rows;

namespace {

// moe: dim, hidden, experts, top_k, score_func (softmax | sigmoid), norm_topk_prob (true),
// routed_scaling_factor (1), selection_bias (false), shared_hidden (none), shared_gate (false),
// aux_loss_coef (0: no load-balancing loss), capacity_factor (0: dropless).
class MoeType final : public ModuleType {
public:
    MoeType() : ModuleType("moe", 145) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        YamlMap& m = e.keys;
        Moe::Options o;
        o.dim = e.positive("dim"), o.hidden = e.positive("hidden");
        o.router.experts = e.positive("experts"), o.router.top_k = e.positive("top_k");
        if (o.router.experts > 4096) m.at("experts").fail("moe experts over 4096");
        if (o.router.top_k > o.router.experts)
            m.at("top_k").fail(
                fmt::format("moe top_k {} is more than its {} experts", o.router.top_k, o.router.experts));
        const std::string score = m.string_or("score_func", "softmax");
        if (score != "softmax" && score != "sigmoid")
            m.at("score_func").fail(fmt::format("score_func '{}': valid: softmax, sigmoid", score));
        o.router.score = score == "softmax" ? RouterScore::softmax : RouterScore::sigmoid;
        o.router.norm_topk_prob = m.bool_or("norm_topk_prob", true);
        o.router.scaling = m.double_or("routed_scaling_factor", 1.0);
        if (!(o.router.scaling > 0) || !std::isfinite(o.router.scaling))
            m.at("routed_scaling_factor").fail("routed_scaling_factor must be a finite number > 0");
        o.selection_bias = m.bool_or("selection_bias", false);
        o.shared_hidden = m.has("shared_hidden") ? e.positive("shared_hidden") : 0;
        o.shared_gate = m.bool_or("shared_gate", false);
        o.capacity_factor = m.double_or("capacity_factor", 0.0);
        if (!(o.capacity_factor >= 0) || !std::isfinite(o.capacity_factor))
            m.at("capacity_factor").fail("capacity_factor must be a finite number >= 0 (0: dropless)");
        o.aux_loss_coef = m.double_or("aux_loss_coef", 0.0);
        if (!(o.aux_loss_coef >= 0) || !std::isfinite(o.aux_loss_coef))
            m.at("aux_loss_coef").fail("aux_loss_coef must be a finite number >= 0");
        if (o.aux_loss_coef > 0 && o.router.score == RouterScore::sigmoid)
            m.at("aux_loss_coef")
                .fail(
                    "aux_loss_coef with score_func sigmoid: ptool's balancing loss is Switch Transformer's "
                    "on "
                    "softmax scores (DeepSeek-V3 balances by its selection bias instead)");
        if (o.shared_gate && !o.shared_hidden) m.at("shared_gate").fail("shared_gate needs shared_hidden");
        const YamlNode at = m.at("experts");
        // gate [experts, dim]; each expert's gate_proj, up_proj [hidden, dim] and down_proj [dim, hidden]
        int64_t n = size_add(at, size_mul(at, o.router.experts, o.dim),
                             size_mul(at, o.router.experts, size_mul(at, 3, size_mul(at, o.dim, o.hidden))));
        n = size_add(at, n, size_mul(at, 3, size_mul(at, o.dim, o.shared_hidden)));
        n = size_add(at, n, (o.shared_gate ? o.dim : 0) + (o.selection_bias ? o.router.experts : 0));
        b.account(at, n);  // and the buffer e_score_correction_bias [experts]
        return std::make_shared<Moe>(e.name, e.where, o, b.dtype());
    }
    // Megatron's tensor parallelism inside experts (without ep): each expert's and the shared expert's
    // gate_proj and up_proj colwise, down_proj rowwise; the router replicated.
    TpTemplate tp_template() const override {
        return {.rule = TpRule::experts, .colwise = ".[gu]*_proj", .rowwise = ".down_proj"};
    }
    ShrinkKeys shrink_keys() const override { return {.sizes = {"dim", "hidden"}}; }
};
const MoeType moe_type;
PTOOL_REGISTER_MODULE_TYPE(moe_type);

// Under tensor parallelism every tp rank routes the same tokens (the layer's input is Replicate
// over tp) and must route them alike: the experts' colwise/rowwise collectives then have one size.
// A correct run computes the same routing on every tp rank; rank 0's is broadcast (verification's
// safeguard, neither counted nor charged) so that a bug upstream (tp ranks holding different
// activations) shows as a divergence verify localises, not as collectives of mismatched sizes.
void agree_over_tp(Communicator& tp, const RouterOptions& o, Routing& r, Device device) {
    CountingPaused uncounted(tp.counter().get());
    MemoryScope unaccounted(nullptr);
    const size_t slots = r.chosen.size();
    std::vector<double> words(2 * slots);
    for (size_t s = 0; s < slots; ++s)
        words[s] = static_cast<double>(r.chosen[s]), words[slots + s] = r.weights[s];
    Tensor t = device_tensor({static_cast<int64_t>(words.size())}, DType::float64, device, words);
    tp.broadcast(t, 0);
    words = host_values(t);
    for (size_t s = 0; s < slots; ++s)
        r.chosen[s] = static_cast<int64_t>(words[s]), r.weights[s] = words[slots + s];
    assign_slots(o, r);
}

std::string shard_word(const Placement& p) {  // as a plan writes it
    return fmt::format("shard({})", p.dim);
}

// The shape of x with its last dim `last`.
Shape with_last(Shape s, int64_t last) {
    s.back() = last;
    return s;
}

}  // namespace

Moe::Moe(std::string name, SourceLocation where, const Options& o, DType dtype)
    : Module(moe_type, std::move(name), std::move(where)),
      o_(o),
      router_(std::make_shared<Router>()),
      dispatch_(std::make_shared<ExpertDispatch>()) {
    add_child("gate", std::make_shared<Linear>("gate", this->where(), o.dim, o.router.experts, false, dtype));
    auto experts = std::make_shared<Sequential>("experts", this->where());
    for (int64_t e = 0; e < o.router.experts; ++e)
        experts->add_child(std::to_string(e),
                           std::make_shared<GatedMlp>(std::to_string(e), this->where(), o.dim, o.hidden,
                                                      o.act, false, dtype));
    add_child("experts", experts);
    if (o.shared_hidden)
        add_child("shared_expert", std::make_shared<GatedMlp>("shared_expert", this->where(), o.dim,
                                                              o.shared_hidden, o.act, false, dtype));
    if (o.shared_gate)
        add_child("shared_expert_gate",
                  std::make_shared<Linear>("shared_expert_gate", this->where(), o.dim, 1, false, dtype));
    if (o.selection_bias) register_buffer("e_score_correction_bias", make_buffer({o.router.experts}, dtype));
}

int64_t inactive_parameters(const Module& root) {
    int64_t n = 0;
    for (const auto& [fqn, m] : named_modules(root))
        if (const RoutedExperts* moe = m->routed_experts()) {
            int64_t per_expert = 0;
            for_each_param(moe->expert(0),
                           [&](const std::string&, const ParamPtr& p) { per_expert += p->value.numel(); });
            n += (moe->experts() - moe->router_options().top_k) * per_expert;
        }
    return n;
}

void Moe::init_params(uint64_t) {
    for (const Entry& b : buffers()) fill_value(b.param->value, 0.0);  // transformers' zeros
}

Shape Moe::output_shape(const Shape& in) const {
    if (in.empty() || in.back() != o_.dim)
        fail(fmt::format("moe '{}' expects [..., {}], got {}", fqn(), o_.dim, shape_str(in)));
    return in;
}

Layout Moe::layout(LayoutVisitor& v, const Layout& in) const {
    const int64_t nd = static_cast<int64_t>(in.global.size());
    const Placement p = in.p.normalized(nd);
    if (p.is_partial() || (p.is_shard() && p.dim == nd - 1))
        conflict(fmt::format("moe '{}' routes whole tokens but gets {}: gather its features first", fqn(),
                             in.p.str()));
    // Every tp rank routes the same tokens (torchtitan's MoE under TP takes its input replicated):
    // the experts' colwise/rowwise collectives need the same rows on each rank, and the routing is
    // agreed over tp. Batch or sequence shards would route each rank's own tokens.
    if (p.is_shard() && v.parts() > 1)
        conflict(fmt::format(
            "moe '{}' routes the same tokens on every tensor-parallel rank but gets them {}: add "
            "prepare_input {} -> replicate on '{}' (and prepare_output replicate -> {} after it, as "
            "torchtitan's PrepareModuleInputOutput on its MoE)",
            fqn(), in.p.str(), shard_word(p), fqn(), shard_word(p)));
    // the router reads each token's logits over every expert, on the tokens it routes
    const Layout logits = v.call(gate(), in);
    if (!logits.p.same_as(in.p, nd))
        conflict(fmt::format(
            "moe '{}' routes each token on all {} of its router logits, but its gate '{}' outputs {}: "
            "leave the gate without a style (the router replicated, as torchtitan's), or end it "
            "Replicate (output_layouts: replicate)",
            fqn(), o_.router.experts, gate().fqn(), logits.p.str()));
    // each expert's rows are this rank's tokens routed to it, [1, rows, dim]: data-dependent, so
    // here (and on meta tensors) the balanced routing's count (model/moe_routing.h)
    int64_t tokens = 1;
    for (int64_t i = 0; i + 1 < nd; ++i) tokens *= in.global[static_cast<size_t>(i)];
    const int64_t slots = tokens * o_.router.top_k, experts = o_.router.experts;
    // an expert's output is weighted and put back at its tokens whole: its styles must end Replicate;
    // the shared expert and its gate are added at the layer's tokens: they end as its input
    auto whole = [&](const Module& m, const Layout& out, const Placement& want) {
        if (!out.p.same_as(want, static_cast<int64_t>(out.global.size())))
            conflict(
                fmt::format("moe '{}' adds the output of '{}' at its tokens, whole ({}), but it outputs "
                            "{}: end it {} (a rowwise down_proj, or output_layouts: replicate)",
                            fqn(), m.fqn(), want.str(), out.str(), want.str()));
    };
    for (int64_t e = 0; e < experts; ++e) {
        const Layout rows{{1, slots / experts + (e < slots % experts ? 1 : 0), o_.dim}, Placement()};
        whole(expert(e), v.call(expert(e), rows), Placement());
    }
    if (Module* s = shared()) whole(*s, v.call(*s, in), in.p);
    if (Linear* g = shared_gate()) whole(*g, v.call(*g, in), in.p);
    return in;
}

Placed Moe::forward_placed(RunContext& ctx, const Placed& x) {
    Backend& be = *ctx.backend;
    const Device dev = x.t.device();
    const DType dt = x.t.dtype();
    const int64_t d = o_.dim, k = o_.router.top_k, n = x.t.numel() / d;
    const Tensor x2 = x.t.reshape({n, d});
    Saved sv;
    const Placed logits = gate().forward(ctx, x);
    if (dev == Device::meta) {
        sv.routing = balanced_routing(o_.router, n);
    } else {
        const std::vector<double> lg = host_values(logits.t);
        const std::vector<double> bias =
            o_.selection_bias ? host_values(buffers()[0].param->value) : std::vector<double>();
        sv.routing = router_->route(o_.router, lg, bias);
        if (ctx.routing) follow_reference(ctx, x, lg, bias, sv.routing);
    }
    if (ctx.tp && ctx.tp->size() > 1 && dev != Device::meta)
        agree_over_tp(*ctx.tp, o_.router, sv.routing, dev);
    if (o_.aux_loss_coef > 0) balance_loss(ctx, sv, dev);  // on the routing before any slot is dropped
    if (o_.capacity_factor > 0) drop_over_capacity(ctx, sv, dev);
    if (ctx.observer) {  // the routing, token by token: each expert's weight (0: not chosen)
        std::vector<double> dense(static_cast<size_t>(n * o_.router.experts), 0.0);
        for (int64_t s = 0; s < n * k; ++s)
            dense[static_cast<size_t>((s / k) * o_.router.experts +
                                      sv.routing.chosen[static_cast<size_t>(s)])] =
                sv.routing.weights[static_cast<size_t>(s)];
        const Shape local = with_last(x.t.shape(), o_.router.experts);
        ctx.observer(sub_event(fqn(), "routing weights"), Phase::forward, ctx.microbatch,
                     {device_tensor(local, dt, dev, dense), x.p, with_last(x.global, o_.router.experts)});
    }
    Tensor out({n, d}, dt, dev);
    {
        // an expert's rows are another rank's tokens on each data rank, and under expert parallelism
        // some are computed on another rank: it reports its output at its tokens' places, nothing
        // inside it (model/moe.h)
        auto observer = std::move(ctx.observer);
        ctx.observer = nullptr;
        experts_forward(ctx, x, sv, out, observer);
        ctx.observer = std::move(observer);
    }
    if (Module* s = shared()) {  // Qwen2-MoE: + sigmoid(shared_expert_gate(x)) * shared_expert(x)
        sv.shared_out = s->forward(ctx, x).t;
        Tensor add = sv.shared_out.reshape({n, d});
        if (Linear* g = shared_gate()) {
            const Tensor gl = g->forward(ctx, x).t;
            std::vector<double> rows;  // (meta: the shapes only)
            if (dev != Device::meta) {
                std::vector<double> gv = host_values(gl);
                for (double& v : gv) v = 1.0 / (1.0 + std::exp(-v));
                rows.reserve(static_cast<size_t>(n * d));
                for (double v : gv) rows.insert(rows.end(), static_cast<size_t>(d), v);
            }
            sv.shared_g = device_tensor({n, d}, dt, dev, rows);
            Tensor gated = empty_like(add);
            be.mul(add, sv.shared_g, gated);
            add = gated;
        }
        be.axpy(1.0, add, out);
    }
    if (ctx.recording) saved_.push(ctx.microbatch, std::move(sv));
    return {out.reshape(x.t.shape()), x.p, x.global};
}

Placed Moe::backward_placed(RunContext& ctx, const Placed& dy, const Layout& in) {
    Backend& be = *ctx.backend;
    const Device dev = dy.t.device();
    const DType dt = dy.t.dtype();
    const int64_t d = o_.dim, k = o_.router.top_k, n = dy.t.numel() / d;
    Saved sv = saved_.pop(ctx.microbatch);
    const Tensor dy2 = dy.t.reshape({n, d});
    Tensor dx({n, d}, dt, dev);
    if (Module* s = shared()) {
        Tensor ds = dy2;
        if (Linear* g = shared_gate()) {  // y = g * s(x): ds = dy g, dg = rowdot(dy, s(x)) g (1 - g)
            ds = empty_like(dy2);
            be.mul(dy2, sv.shared_g, ds);
            std::vector<double> dg = row_dots(be, dy2, sv.shared_out, n, d);
            if (dev != Device::meta) {
                const std::vector<double> gv = host_values(sv.shared_g);
                for (int64_t i = 0; i < n; ++i) {
                    const double gi = gv[static_cast<size_t>(i * d)];
                    dg[static_cast<size_t>(i)] *= gi * (1 - gi);
                }
            }
            const Shape gl = with_last(dy.global, 1);
            const Placed dxg =
                g->backward(ctx, {device_tensor(with_last(dy.t.shape(), 1), dt, dev, dg), dy.p, gl});
            be.axpy(1.0, dxg.t.reshape({n, d}), dx);
        }
        const Placed dxs = s->backward(ctx, {ds.reshape(dy.t.shape()), dy.p, dy.global});
        be.axpy(1.0, dxs.t.reshape({n, d}), dx);
    }
    std::vector<double> d_weights(static_cast<size_t>(n * k), 0.0);
    {
        auto observer = std::move(ctx.observer);
        ctx.observer = nullptr;
        experts_backward(ctx, dy, sv, dx, d_weights, observer);
        ctx.observer = std::move(observer);
    }
    std::vector<double> dl = router_->backward(o_.router, sv.routing, d_weights);
    if (!sv.aux_grad.empty() && dev != Device::meta) {  // + the balancing loss's, through the softmax
        const int64_t e = o_.router.experts;
        for (int64_t t = 0; t < n; ++t) {
            const double* p = sv.routing.scores.data() + t * e;
            double dot = 0;
            for (int64_t i = 0; i < e; ++i) dot += p[i] * sv.aux_grad[static_cast<size_t>(i)];
            for (int64_t i = 0; i < e; ++i)
                dl[static_cast<size_t>(t * e + i)] += p[i] * (sv.aux_grad[static_cast<size_t>(i)] - dot);
        }
    }
    const Shape lg = with_last(dy.global, o_.router.experts);
    const Placed dxr = gate().backward(
        ctx, {device_tensor(with_last(dy.t.shape(), o_.router.experts), dt, dev, dl), dy.p, lg});
    be.axpy(1.0, dxr.t.reshape({n, d}), dx);
    return {dx.reshape(dy.t.shape()), dy.p, in.global};
}

// The load-balancing loss (Switch Transformer's; Megatron's switch_load_balancing_loss_func), per
// layer over the tokens of every rank whose tokens differ (the data ranks and cp ranks, ctx.tokens):
//   aux = coef E sum_e f_e P_e,  f_e = the share of the T k slots routed to e (not differentiated),
//                                P_e = the mean over the T tokens of e's softmax score
// Each rank sums its counts and scores, one all_reduce sums them over the group, and every rank
// takes the same aux. Its gradient on a rank's tokens, d aux / d p_te = coef E f_e / T, is scaled by
// the microbatch's loss factor and by the group's size where data parallel averages the gradients over
// those ranks (each rank holds one part of the sum; under global_tokens they are summed: no factor).
void Moe::balance_loss(RunContext& ctx, Saved& sv, Device dev) const {
    const int64_t e = o_.router.experts, k = o_.router.top_k, n = sv.routing.tokens;
    std::vector<double> stats(static_cast<size_t>(2 * e + 1), 0.0);  // counts, score sums, tokens
    if (dev != Device::meta) {
        for (int64_t c : sv.routing.chosen) stats[static_cast<size_t>(c)] += 1;
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < e; ++i)
                stats[static_cast<size_t>(e + i)] += sv.routing.scores[static_cast<size_t>(t * e + i)];
    }
    stats.back() = static_cast<double>(n);
    double ranks = 1;
    if (ctx.tokens && ctx.tokens->size() > 1 && router_->reduces_balance()) {
        CommScope scope(ctx.tokens->counter().get(), fqn(), {CommSiteKind::expert_balance});
        Tensor t = device_tensor({2 * e + 1}, DType::float64, dev, stats);
        ctx.tokens->all_reduce(t, ReduceOp::sum);
        if (dev != Device::meta) stats = host_values(t);
        ranks = ctx.grads_summed ? 1 : ctx.tokens->size();
    }
    if (dev == Device::meta) return;
    const double tokens = stats.back();
    double aux = 0;
    sv.aux_grad.assign(static_cast<size_t>(e), 0.0);
    for (int64_t i = 0; i < e; ++i) {
        const double f = stats[static_cast<size_t>(i)] / (tokens * static_cast<double>(k));
        aux += f * stats[static_cast<size_t>(e + i)] / tokens;
        sv.aux_grad[static_cast<size_t>(i)] =
            o_.aux_loss_coef * static_cast<double>(e) * f / tokens * ctx.loss_scale * ranks;
    }
    if (ctx.aux_loss && !ctx.recomputing) *ctx.aux_loss += o_.aux_loss_coef * static_cast<double>(e) * aux;
}

// Capacity-factor routing (GShard's and Switch Transformer's expert capacity; Megatron's
// moe_expert_capacity_factor with the position drop policy): each expert takes at most
// C = ceil(capacity_factor x T x k / E) of the layer's slots, T the microbatch's tokens, first come first
// served in the microbatch's token order; a dropped slot's weight is 0 (its token keeps its other
// experts' outputs, and the residual). T and the order are the whole microbatch's, as on one device:
// a data rank's tokens come after those of the ranks before it in the group (ctx.tokens, rows in
// rank order), whose counts per expert one all_gather brings. (Megatron takes the capacity over each
// rank's own tokens, which changes the model with the data-parallel size: not modelled.)
void Moe::drop_over_capacity(RunContext& ctx, Saved& sv, Device dev) const {
    Routing& r = sv.routing;
    const int64_t e = o_.router.experts, k = o_.router.top_k, w = e + 1;
    std::vector<double> mine(static_cast<size_t>(w));
    for (int64_t i = 0; i < e; ++i)
        mine[static_cast<size_t>(i)] = static_cast<double>(r.slots[static_cast<size_t>(i)].size());
    mine.back() = static_cast<double>(r.tokens);
    int ranks = 1, me = 0;
    std::vector<double> all = mine;
    if (ctx.tokens && ctx.tokens->size() > 1) {
        ranks = ctx.tokens->size(), me = ctx.tokens->rank();
        CommScope scope(ctx.tokens->counter().get(), fqn(), {CommSiteKind::expert_balance});
        Tensor t = device_tensor({w}, DType::float64, dev, mine), g({ranks * w}, DType::float64, dev);
        ctx.tokens->all_gather(t, g);
        if (dev != Device::meta) {
            all = host_values(g);
        } else {  // every rank routes alike on meta tensors (balanced routing)
            all.clear();
            for (int q = 0; q < ranks; ++q) all.insert(all.end(), mine.begin(), mine.end());
        }
    }
    double tokens = 0;
    for (int q = 0; q < ranks; ++q) tokens += all[static_cast<size_t>(q * w + e)];
    const double cap =
        std::ceil(o_.capacity_factor * tokens * static_cast<double>(k) / static_cast<double>(e));
    for (int64_t i = 0; i < e; ++i) {
        double before = 0;  // the expert's slots on the ranks before this one
        for (int q = 0; q < me; ++q) before += all[static_cast<size_t>(q * w + i)];
        std::vector<int64_t>& slots = r.slots[static_cast<size_t>(i)];
        const auto keep =
            static_cast<size_t>(std::clamp(cap - before, 0.0, static_cast<double>(slots.size())));
        for (size_t j = keep; j < slots.size(); ++j) r.weights[static_cast<size_t>(slots[j])] = 0;
        slots.resize(keep);
    }
}

// Routing-aware verdicts (model/routing_log.h). The reference logs its routing and near-ties; a
// parallel rank finds each of its tokens in the reference's microbatch (its global row: the data
// rank's rows, the tp rank's under Shard(0); its position: the cp rank's, the tp rank's chunk under
// Shard(1)) and takes the reference's choice for a near-tie it routed otherwise.
void Moe::follow_reference(RunContext& ctx, const Placed& x, const std::vector<double>& logits,
                           const std::vector<double>& bias, Routing& r) const {
    RoutingLog& log = *ctx.routing;
    const int64_t k = o_.router.top_k, n = r.tokens;
    const bool rows_only = x.t.dim() < 3;  // [rows, dim]: one token per row
    if (!ctx.routing_replays) {
        if (ctx.recomputing) return;  // logged by the call it recomputes
        RoutedCall c;
        c.first_row = ctx.row_offset, c.seq = rows_only ? 1 : x.t.size(1), c.k = k, c.chosen = r.chosen;
        c.tie.resize(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t)
            c.tie[static_cast<size_t>(t)] = near_tie(o_.router, r, t, logits, bias, log.rtol(), log.atol());
        log.record(ctx.step, ctx.microbatch, fqn(), std::move(c));
        return;
    }
    const RoutedCall* ref = log.find(ctx.step, ctx.microbatch, fqn());
    if (!ref) return;
    const int64_t rows = x.t.size(0), seq = rows_only ? 1 : x.t.size(1);
    const int64_t nd = static_cast<int64_t>(x.global.size());
    const Placement p = x.p.normalized(nd);
    const int64_t row0 =
        p.is_shard() && p.dim == 0 ? chunk_of(x.global[0], ctx.tp_parts, ctx.tp_rank).offset : 0;
    const int64_t pos0 =
        p.is_shard() && p.dim == 1 ? chunk_of(x.global[1], ctx.tp_parts, ctx.tp_rank).offset : 0;
    int64_t replayed = 0;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < seq; ++j) {
            const int64_t t = i * seq + j, at = pos0 + j;
            const int64_t pos = rows_only     ? 0
                                : ctx.context ? ctx.context->positions[static_cast<size_t>(at)]
                                              : at;
            const int64_t g = (ctx.row_offset + row0 + i - ref->first_row) * ref->seq + pos;
            if (g < 0 || g >= static_cast<int64_t>(ref->tie.size()) || !ref->tie[static_cast<size_t>(g)])
                continue;
            const int64_t* want = ref->chosen.data() + g * k;
            std::vector<int64_t> a(want, want + k),
                b(r.chosen.begin() + t * k, r.chosen.begin() + (t + 1) * k);
            std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
            if (a == b) continue;
            force_choice(*router_, o_.router, r, t, logits, bias, want);
            ++replayed;
        }
    if (replayed) assign_slots(o_.router, r);
    // each token counted once: not again by every tp rank that holds it whole, nor when recomputed
    if (!ctx.recomputing && (ctx.tp_rank == 0 || p.is_shard())) log.count_replayed(replayed);
}

void Moe::experts_forward(RunContext& ctx, const Placed& x, Saved& sv, Tensor& out,
                          const Observer& observer) {
    if (ctx.ep && ctx.ep->size() > 1) return dispatched_forward(ctx, x, sv, out, observer);
    Backend& be = *ctx.backend;
    const Device dev = x.t.device();
    const DType dt = x.t.dtype();
    const int64_t d = o_.dim, k = o_.router.top_k;
    const Tensor x2 = x.t.reshape({x.t.numel() / d, d});
    for (int64_t e = 0; e < o_.router.experts; ++e) {
        const ExpertRows r = expert_rows(sv.routing, e, k, d, dt, dev);
        Tensor xe = Tensor::empty({1, r.n, d}, dt, dev);
        if (r.n) be.embedding(r.ids, x2, xe);
        const Placed ye = expert(e).forward(ctx, Placed(xe));
        if (observer) observer(expert(e).fqn(), Phase::forward, ctx.microbatch, at_tokens(be, r, ye.t, x));
        Tensor weighted = empty_like(ye.t);
        be.mul(ye.t, r.weights, weighted);
        if (r.n) be.embedding_backward(r.ids, weighted.reshape({r.n, d}), out);
        sv.outputs.push_back(ye.t);
    }
}

void Moe::experts_backward(RunContext& ctx, const Placed& dy, Saved& sv, Tensor& dx,
                           std::vector<double>& d_weights, const Observer& observer) {
    if (ctx.ep && ctx.ep->size() > 1) return dispatched_backward(ctx, dy, sv, dx, d_weights, observer);
    Backend& be = *ctx.backend;
    const Device dev = dy.t.device();
    const DType dt = dy.t.dtype();
    const int64_t d = o_.dim, k = o_.router.top_k;
    const Tensor dy2 = dy.t.reshape({dy.t.numel() / d, d});
    for (int64_t e = o_.router.experts - 1; e >= 0; --e) {
        const ExpertRows r = expert_rows(sv.routing, e, k, d, dt, dev);
        Tensor dye = Tensor::empty({1, r.n, d}, dt, dev), din = Tensor::empty({1, r.n, d}, dt, dev);
        if (r.n) be.embedding(r.ids, dy2, dye);
        const std::vector<double> dw = row_dots(be, dye, sv.outputs[static_cast<size_t>(e)], r.n, d);
        for (int64_t i = 0; i < r.n; ++i)
            d_weights[static_cast<size_t>(sv.routing.slots[static_cast<size_t>(e)][static_cast<size_t>(i)])] =
                dev == Device::meta ? 0.0 : dw[static_cast<size_t>(i)];
        be.mul(dye, r.weights, din);
        const Placed dxe = expert(e).backward(ctx, Placed(din));
        if (observer) observer(expert(e).fqn(), Phase::backward, ctx.microbatch, at_tokens(be, r, dxe.t, dy));
        if (r.n) be.embedding_backward(r.ids, dxe.t.reshape({r.n, d}), dx);
    }
}

}  // namespace ptool
