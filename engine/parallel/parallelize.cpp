#include "parallel/parallelize.h"

#include <set>

#include "core/tensor_ops.h"
#include "model/blocks.h"

namespace ptool {
namespace {

const std::set<std::string> kElementwise = {"relu", "gelu", "silu", "tanh", "identity", "dropout"};

std::string at(const SourceLocation& w) { return w.str() + ": "; }

void check_applicable(const PlanEntry& e, const Module& m, const Model& model) {
    const std::string& s = e.style.style;
    if ((s == "colwise" || s == "rowwise") && m.type() != "linear" && m.type() != "embedding")
        throw InputError(e.where, fmt::format("'{}' matches '{}', a {}: {} applies to linear and embedding modules",
                                              e.pattern, m.fqn(), m.type(), s));
    if (s == "sequence_parallel" && m.type() != "layer_norm" && m.type() != "rms_norm" && m.type() != "dropout")
        throw InputError(e.where, fmt::format("'{}' matches '{}', a {}: sequence_parallel applies to layer_norm, "
                                              "rms_norm and dropout",
                                              e.pattern, m.fqn(), m.type()));
    if (s == "colwise" || s == "rowwise") {  // a weight reachable under two names cannot be sharded for one
        int names = 0;
        for (const auto& [name, p] : model.state_dict()) names += p == m.param("weight");
        if (names > 1)
            throw InputError(e.where, fmt::format("'{}' has a tied weight: {} of tied weights is not supported", m.fqn(), s));
    }
}

bool is_embedding(const Module& m) { return m.type() == "embedding"; }

// Follows placements through the leaves in forward order and warns where a module that needs
// whole rows gets a tensor sharded on its last dim. Containers are transparent here (a residual's
// skip connection and attention's internals are not modelled).
void lint_dataflow(const Model& model, const Resolution& res, const Plan& plan, std::vector<std::string>& warnings) {
    std::map<const Module*, const ResolvedStyle*> styled;
    for (const auto& r : res.styles) styled[r.module] = &r;
    Placement act = res.input_placement;
    std::string producer = "the model input";
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        auto it = styled.find(&m);
        if (it != styled.end()) {
            const StyleSpec& s = it->second->entry->style;
            if (s.style == "sequence_parallel") act = Placement::shard(1);
            else if (s.style == "colwise") act = s.output_layouts.value_or(Placement::shard(-1));
            else if (s.style == "rowwise") act = s.output_layouts.value_or(Placement::replicate());
            else if (s.desired_output_layouts) act = *s.desired_output_layouts;
            else if (s.desired_input_layouts && m.children().empty()) act = *s.desired_input_layouts;
            producer = fqn.empty() ? "the root module" : "'" + fqn + "'";
            return;
        }
        if (!m.children().empty()) return;
        const bool last_dim_sharded = act.is_shard() && act.dim == -1;
        if (last_dim_sharded && !kElementwise.count(m.type())) {
            warnings.push_back(fmt::format("{}{} outputs {} but '{}' ({}) needs whole rows: give it a style, or have "
                                           "{} output replicate",
                                           at(plan.tp_plan_where), producer, act.str(), fqn, m.type(), producer));
            act = Placement::replicate();  // one finding per cause: what follows is judged as if it were fixed
        }
        const bool rows_sharded = act.is_shard() && act.dim != -1;
        if (rows_sharded && !m.params().empty())
            warnings.push_back(fmt::format("{}'{}' ({}) gets {} activations from {}: each rank's gradients of its "
                                           "replicated parameters cover only its rows and are not reduced: give it "
                                           "sequence_parallel, or gather the activation first",
                                           at(plan.tp_plan_where), fqn, m.type(), act.str(), producer));
        if (act.is_shard() && m.type() == "dropout")
            warnings.push_back(fmt::format("{}dropout '{}' runs on a sharded activation: its mask is drawn per local "
                                           "element, not per global one, so it differs from the reference",
                                           at(plan.tp_plan_where), fqn));
        if (!kElementwise.count(m.type())) producer = "'" + fqn + "'";
    });
}

}  // namespace

static void resolve_tensor_parallel(const Model& model, const Plan& plan, Resolution& res);

Resolution resolve_plan(const Model& model, const Plan& plan) {
    Resolution res;
    res.dp = resolve_data_parallel(model, plan, res.warnings, res.causes);
    if (plan.has_tensor_parallel) resolve_tensor_parallel(model, plan, res);
    return res;
}

static void resolve_tensor_parallel(const Model& model, const Plan& plan, Resolution& res) {
    if (plan.tp_plan.empty()) res.warnings.push_back(at(plan.tp_plan_where) + "the tensor_parallel plan is empty: nothing is parallelized");
    std::map<const Module*, const PlanEntry*> owner;
    int tp = 1;
    for (const MeshDim& d : plan.mesh)
        if (d.name == plan.tp_mesh_dim) tp = d.size;
    for (const PlanEntry& e : plan.tp_plan) {
        int matched = 0;
        for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
            if (!fqn_matches(e.pattern, fqn)) return;
            ++matched;
            check_applicable(e, m, model);
            if (owner.count(&m))
                throw InputError(e.where, fmt::format("'{}' and '{}' (line {}) both match '{}': one style per module",
                                                      e.pattern, owner[&m]->pattern, owner[&m]->where.line, fqn));
            owner[&m] = &e;
        });
        if (!matched) res.warnings.push_back(fmt::format("{}pattern '{}' matched no module", at(e.where), e.pattern));
    }
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        auto it = owner.find(&m);
        if (it == owner.end()) return;
        res.styles.push_back({fqn, &m, it->second});
        const std::string& s = it->second->style.style;
        if (s == "colwise" || s == "rowwise") {
            int64_t n = 0;
            const char* what = "";
            if (is_embedding(m)) {
                const auto& e = static_cast<const Embedding&>(m);
                n = s == "colwise" ? e.dim() : e.vocab();
                what = s == "colwise" ? "embedding dims" : "vocabulary rows";
            } else {
                const auto& lin = static_cast<const Linear&>(m);
                n = s == "colwise" ? lin.out_features() : lin.in_features();
                what = s == "colwise" ? "output features" : "input features";
            }
            if (n % tp != 0) {
                std::vector<int64_t> sizes;
                for (int r = 0; r < tp; ++r) sizes.push_back(chunk_of(n, tp, r).length);
                res.warnings.push_back(fmt::format("{}'{}' {}: {} {} over {} ranks are uneven ({})", at(it->second->where),
                                                   fqn, s, n, what, tp, fmt::join(sizes, ", ")));
            }
        }
    });
    // attention under TP: q/k/v colwise split whole heads (DESIGN §5: heads % tp == 0 is checked)
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        auto* attn = dynamic_cast<Attention*>(&m);
        if (!attn) return;
        for (const auto& [name, child] : m.children()) {
            auto it = owner.find(child.get());
            if (it == owner.end() || it->second->style.style != "colwise") continue;
            const int64_t heads = name == "q_proj" ? attn->heads() : attn->kv_heads();
            if (name != "o_proj" && heads % tp != 0)
                throw InputError(it->second->where,
                                 fmt::format("'{}.{}' colwise splits {} {}heads over {} ranks: heads must divide evenly",
                                             fqn, name, heads, name == "q_proj" ? "" : "kv ", tp));
        }
    });
    // the model input arrives as the input_layouts of the first styled module on the path of first children
    const Module* m = model.root.get();
    while (m) {
        auto it = owner.find(m);
        if (it != owner.end() && it->second->style.style == "sequence_parallel") {
            res.input_placement = Placement::shard(1);
            break;
        }
        if (it != owner.end() && !is_embedding(*m) &&
            (it->second->style.input_layouts || it->second->style.style == "rowwise")) {
            res.input_placement = it->second->style.input_layouts.value_or(Placement::shard(-1));
            break;
        }
        m = m->children().empty() ? nullptr : m->children()[0].second.get();
    }
    lint_dataflow(model, res, plan, res.warnings);
}

bool shards_parameters(const Resolution& res, const Module& m) {
    for (const ResolvedStyle& rs : res.styles)
        if (rs.module == &m) return rs.entry->style.style == "colwise" || rs.entry->style.style == "rowwise";
    return false;
}

void parallelize(Model& model, const Plan& plan, const Resolution& res, DeviceMesh& mesh,
                 const std::shared_ptr<TpState>& state, bool build_own_shards) {
    if (!plan.has_tensor_parallel) return;
    Communicator& comm = mesh.comm(mesh.dim_index(plan.tp_mesh_dim));
    state->comm = &comm;
    const int n = comm.size(), r = comm.rank();
    auto shard_param = [&](const std::string& fqn, ParamPtr p, int64_t dim, const Module& mod, const char* name) {
        if (build_own_shards) {  // draw this rank's slice only: no communication, no full tensor
            const Chunk c = chunk_of(p->value.size(dim), n, r);
            Tensor local = Tensor::empty(local_shape(p->value.shape(), Placement::shard(dim), n, r), p->value.dtype());
            if (is_embedding(mod)) static_cast<const Embedding&>(mod).init_shard(model.seed, local, dim, c.offset);
            else static_cast<const Linear&>(mod).init_shard(model.seed, name, local, dim, c.offset);
            p->value = local;
            p->grad = Tensor::empty(local.shape(), local.dtype());
            state->param_placement[p.get()] = Placement::shard(dim);
            return;
        }
        Tensor full = p->value;
        if (plan.src_data_rank) {  // rank k's weights are the source; the others' must not matter
            const int src = state->fault.hits("wrong_src_rank", fqn) ? (*plan.src_data_rank + 1) % n : *plan.src_data_rank;
            if (r != *plan.src_data_rank) poison_replica(full, r);
            comm.broadcast(full, src);
        }
        Tensor local = chunk(full, n, r, dim);
        if (state->fault.hits("wrong_shard_offset", fqn) && local.numel() > 0) {
            // off by one row: this rank's chunk size, taken one row later (earlier at the end)
            const Chunk c = chunk_of(full.size(dim), n, r);
            const int64_t start = c.offset + c.length < full.size(dim) ? c.offset + 1 : c.offset - 1;
            if (start >= 0) local = full.narrow(dim, start, c.length).clone();
        }
        if (state->fault.hits("wrong_shard_dim", fqn) && full.dim() == 2 && local.numel() > 0) {
            // sharded along the other dim: that chunk's values poured into this shard's shape
            Tensor other = chunk(full, n, r, 1 - dim);
            for (int64_t i = 0; i < local.numel(); ++i) local.set(i, other.numel() ? other.item(i % other.numel()) : 0.0);
        }
        p->value = local;
        p->grad = Tensor::empty(local.shape(), local.dtype(), local.device());
        state->param_placement[p.get()] = Placement::shard(dim);
    };
    auto counter = mesh.counter();
    for (const ResolvedStyle& rs : res.styles) {
        if (counter) counter->set_module(rs.fqn);
        const std::string& s = rs.entry->style.style;
        if ((s == "colwise" || s == "rowwise") && is_embedding(*rs.module)) {
            // colwise: the embedding dim (weight Shard(1)); rowwise: the vocabulary (Shard(0))
            auto& emb = static_cast<Embedding&>(*rs.module);
            const int64_t dim = s == "colwise" ? 1 : 0;
            shard_param(rs.fqn, rs.module->param("weight"), dim, emb, "weight");
            if (s == "rowwise") emb.set_vocab_offset(chunk_of(emb.vocab(), n, r).offset);
        } else if (s == "colwise" || s == "rowwise") {
            const auto& lin = static_cast<const Linear&>(*rs.module);
            shard_param(rs.fqn, rs.module->param("weight"), s == "colwise" ? 0 : 1, lin, "weight");
            if (auto b = rs.module->param("bias")) {
                if (s == "colwise") shard_param(rs.fqn, b, 0, lin, "bias");
                else if (build_own_shards) lin.init_shard(model.seed, "bias", b->value, -1, 0);  // Replicate
                else if (plan.src_data_rank) {
                    if (r != *plan.src_data_rank) poison_replica(b->value, r);
                    comm.broadcast(b->value, state->fault.hits("wrong_src_rank", rs.fqn) ? (*plan.src_data_rank + 1) % n
                                                                                         : *plan.src_data_rank);
                }
            }
        }
        rs.module->set_hooks(make_style_hooks(rs.entry->style, *rs.module, state));
    }
    if (counter) counter->set_module("");
}

}  // namespace ptool
