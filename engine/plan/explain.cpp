#include "plan/explain.h"

#include <map>
#include <optional>
#include <set>

#include "core/tensor_ops.h"
#include "model/batch.h"

namespace ptool {

std::vector<CommCost> redistribute_cost(const Placement& from_in, const Placement& to_in, const Shape& global, int n,
                                        size_t es) {
    const int64_t nd = static_cast<int64_t>(global.size());
    const Placement from = from_in.normalized(nd), to = to_in.normalized(nd);
    const int64_t bytes = numel_of(global) * static_cast<int64_t>(es);
    if (n == 1 || from.same_as(to, nd)) return {};
    if (from.is_shard() && (to.is_replicate() || to.is_shard())) return {{"all_gather", bytes, "", ""}};
    if (from.is_partial() && to.is_replicate()) return {{"all_reduce", bytes, "", ""}};
    if (from.is_partial() && to.is_shard()) return {{"reduce_scatter", bytes, "", ""}};
    return {};  // Replicate -> Shard / Partial: local
}

namespace {

Placement grad_of(const Placement& p) { return p.is_partial() ? Placement::replicate() : p; }

// The collectives a styled module runs in one step, mirroring tp_styles.cpp.
void style_comm(const StyleSpec& s, const Module& m, const Shape& in, const Shape& out, int n, size_t es,
                std::vector<CommCost>& fwd, std::vector<CommCost>& bwd) {
    auto add = [&](std::vector<CommCost>& list, std::vector<CommCost> c) { list.insert(list.end(), c.begin(), c.end()); };
    const Placement R = Placement::replicate(), last = Placement::shard(-1), P = Placement::partial();
    if (s.style == "sequence_parallel") {  // parameter gradients are partial sums over rows
        for (const auto& e : m.params()) add(bwd, redistribute_cost(P, R, e.param->value.shape(), n, es));
    } else if (m.type() == "embedding" && s.style == "colwise") {
        const Placement o = s.output_layouts.value_or(last);
        add(fwd, redistribute_cost(last, o, out, n, es));
        add(bwd, redistribute_cost(grad_of(o), last, out, n, es));
    } else if (m.type() == "embedding" && s.style == "rowwise") {
        const Placement o = s.output_layouts.value_or(R);
        add(fwd, redistribute_cost(P, o, out, n, es));
        add(bwd, redistribute_cost(grad_of(o), R, out, n, es));
    } else if (s.style == "colwise") {
        const Placement i = s.input_layouts.value_or(R), o = s.output_layouts.value_or(last);
        add(fwd, redistribute_cost(i, R, in, n, es));
        add(fwd, redistribute_cost(last, o, out, n, es));
        add(bwd, redistribute_cost(grad_of(o), last, out, n, es));
        add(bwd, redistribute_cost(P, grad_of(i), in, n, es));
    } else if (s.style == "rowwise") {
        const Placement i = s.input_layouts.value_or(last), o = s.output_layouts.value_or(R);
        add(fwd, redistribute_cost(i, last, in, n, es));
        add(fwd, redistribute_cost(P, o, out, n, es));
        if (auto b = m.param("bias")) {  // the replicated bias's gradient, summed over sharded rows
            const Placement g = grad_of(o).normalized(static_cast<int64_t>(out.size()));
            const Shape bs = b->value.shape();
            if (g.is_partial() || (g.is_shard() && g.dim != static_cast<int64_t>(out.size()) - 1))
                add(bwd, redistribute_cost(P, R, bs, n, es));
            else if (g.is_shard())
                add(bwd, redistribute_cost(Placement::shard(0), R, bs, n, es));
        }
        add(bwd, redistribute_cost(grad_of(o), R, out, n, es));
        add(bwd, redistribute_cost(last, grad_of(i), in, n, es));
    } else {
        if (s.input_layouts) add(fwd, redistribute_cost(*s.input_layouts, *s.desired_input_layouts, in, n, es));
        if (s.output_layouts) {
            add(fwd, redistribute_cost(*s.output_layouts, *s.desired_output_layouts, out, n, es));
            add(bwd, redistribute_cost(grad_of(*s.desired_output_layouts), grad_of(*s.output_layouts), out, n, es));
        }
        if (s.input_layouts)
            add(bwd, redistribute_cost(grad_of(*s.desired_input_layouts), grad_of(*s.input_layouts), in, n, es));
    }
}

}  // namespace

namespace {

// Every module's global input and output shape, from one forward pass on one device, and the
// bytes of the floating-point inputs (their gradients are verify's backward events).
// Uses (and leaves saves on) `model`: pass a model loaded for this purpose.
struct ShapeRecorder : ModuleHooks {
    std::map<const Module*, std::pair<Shape, Shape>>* shapes = nullptr;
    int64_t float_input_bytes = 0;
    Tensor pre_forward(RunContext&, Module& m, const Tensor& x) override {
        (*shapes)[&m].first = x.shape();
        if (dtype_is_float(x.dtype())) float_input_bytes += static_cast<int64_t>(x.nbytes());
        return x;
    }
    Tensor post_forward(RunContext&, Module& m, const Tensor& y) override {
        (*shapes)[&m].second = y.shape();
        return y;
    }
};

}  // namespace

Explanation explain_plan(Model& model, const Plan& plan) {
    Explanation ex;
    ex.resolution = resolve_plan(model, plan);
    for (const MeshDim& d : plan.mesh)
        if (d.name == plan.tp_mesh_dim) ex.tp = d.size;
    const int n = ex.tp;
    const size_t es = dtype_size(model.dtype);

    std::map<const Module*, std::pair<Shape, Shape>> shapes;
    auto recorder = std::make_shared<ShapeRecorder>();
    recorder->shapes = &shapes;
    for_each_module(*model.root, [&](const std::string&, Module& m) { m.set_hooks(recorder); });
    DataSource data(model);
    int64_t output_bytes = 0;  // every module's forward output: verify's forward events
    RunContext ctx{&backend_for(Device::cpu), model.seed, 0, true, 0,
                   [&](const Module&, const char*, const Tensor& y) { output_bytes += static_cast<int64_t>(y.nbytes()); }};
    ex.dp = ex.resolution.dp.size;
    const Tensor batch = data.batch(0).input, rows = chunk(batch, ex.dp, 0, 0);
    const Tensor out = model.root->forward(ctx, rows);  // one data-parallel rank's rows
    for_each_module(*model.root, [&](const std::string&, Module& m) { m.set_hooks(nullptr); });

    // verify's record of one step on rank 0, every tensor full size: parameters, gradients,
    // buffers, output, loss, and every module's output and input gradient (localisation's events)
    const double full_rows = batch.dim() && rows.dim() && rows.size(0) ? static_cast<double>(batch.size(0)) / rows.size(0) : 1.0;
    ex.record_step_bytes = static_cast<int64_t>(std::llround((output_bytes + recorder->float_input_bytes + out.nbytes()) * full_rows));
    ex.record_step_bytes += static_cast<int64_t>(es);  // the loss
    for (const auto& [name, p] : model.named_parameters()) ex.record_step_bytes += 2 * static_cast<int64_t>(p->value.nbytes());
    for (const auto& [name, b] : model.named_buffers()) ex.record_step_bytes += static_cast<int64_t>(b->value.nbytes());

    // the step's collectives: styled modules' forward costs in forward order, backward in reverse
    std::vector<std::vector<CommCost>> backward_lists;
    // where the model output ends up (the runner gathers it for the loss): the outermost module on
    // the path of last children that sets an output placement; else the last one set in forward order
    const Placement out_placement = [&] {
        std::map<const Module*, const StyleSpec*> style_of;
        for (const ResolvedStyle& rs : ex.resolution.styles) style_of[rs.module] = &rs.entry->style;
        auto output_of = [](const StyleSpec& s) -> std::optional<Placement> {
            if (s.style == "sequence_parallel") return Placement::shard(1);
            if (s.style == "colwise") return s.output_layouts.value_or(Placement::shard(-1));
            if (s.style == "rowwise") return s.output_layouts.value_or(Placement::replicate());
            return s.desired_output_layouts;
        };
        for (const Module* m = model.root.get(); m; m = m->children().empty() ? nullptr : m->children().back().second.get()) {
            auto it = style_of.find(m);
            if (it != style_of.end())
                if (auto p = output_of(*it->second)) return *p;
        }
        Placement p = ex.resolution.input_placement;
        for (const ResolvedStyle& rs : ex.resolution.styles) {
            if (auto o = output_of(rs.entry->style)) p = *o;
            else if (rs.entry->style.desired_input_layouts) p = *rs.entry->style.desired_input_layouts;
        }
        return p;
    }();
    for (const ResolvedStyle& rs : ex.resolution.styles) {
        ModuleExplain me;
        me.fqn = rs.fqn;
        me.pattern = rs.entry->pattern;
        me.style = rs.entry->style.style;
        me.input = shapes[rs.module].first;
        me.output = shapes[rs.module].second;
        std::vector<CommCost> fwd, bwd;
        style_comm(rs.entry->style, *rs.module, me.input, me.output, n, es, fwd, bwd);
        for (auto& c : fwd) c.module = rs.fqn, c.phase = "forward", ex.step_comm.push_back(c);
        for (auto& c : bwd) c.module = rs.fqn, c.phase = "backward";
        backward_lists.push_back(bwd);
        if ((me.style == "colwise" || me.style == "rowwise") && rs.module->type() == "embedding") {
            ParamPtr p = rs.module->param("weight");
            ParamLayout pl;
            pl.fqn = join_name(rs.fqn, "weight");
            pl.full = p->value.shape();
            pl.placement = Placement::shard(me.style == "colwise" ? 1 : 0);
            for (int r = 0; r < n; ++r) pl.local.push_back(local_shape(pl.full, pl.placement, n, r));
            me.params.push_back(pl);
        } else if (me.style == "colwise" || me.style == "rowwise") {
            const int64_t wdim = me.style == "colwise" ? 0 : 1;
            for (const char* pname : {"weight", "bias"}) {
                ParamPtr p = rs.module->param(pname);
                if (!p) continue;
                ParamLayout pl;
                pl.fqn = join_name(rs.fqn, pname);
                pl.full = p->value.shape();
                const bool sharded = std::string(pname) == "weight" || me.style == "colwise";
                pl.placement = sharded ? Placement::shard(std::string(pname) == "weight" ? wdim : 0) : Placement::replicate();
                for (int r = 0; r < n; ++r) pl.local.push_back(local_shape(pl.full, pl.placement, n, r));
                me.params.push_back(pl);
            }
        }
        ex.modules.push_back(std::move(me));
    }
    Shape out_rows = model.output_shape;
    if (!out_rows.empty()) out_rows[0] /= ex.dp;
    for (auto& c : redistribute_cost(out_placement, Placement::replicate(), out_rows, n, es))
        c.module = "(loss)", c.phase = "forward", ex.step_comm.push_back(c);
    for (auto it = backward_lists.rbegin(); it != backward_lists.rend(); ++it)
        ex.step_comm.insert(ex.step_comm.end(), it->begin(), it->end());

    // memory per rank: parameters, gradients, optimizer state (SGD momentum 1x, AdamW 2x)
    std::map<const Parameter*, const ParamLayout*> layouts;
    for (const auto& me : ex.modules)
        for (const auto& pl : me.params)
            for (const auto& [name, p] : model.named_parameters())
                if (name == pl.fqn) layouts[p.get()] = &pl;
    auto tp_local = [&](const Parameter* p, int r) {
        auto it = layouts.find(p);
        return it == layouts.end() ? p->value.shape() : it->second->local[r];
    };
    if (ex.resolution.dp.active) explain_data_parallel(model, plan, ex, tp_local);
    const double state = model.optimizer.type == "adamw" ? 2 : (model.optimizer.momentum != 0 ? 1 : 0);
    std::set<const Parameter*> fsdp;
    for (const auto& u : ex.resolution.dp.units)
        for (const auto& [name, p] : model.named_parameters())
            if (std::find(u.params.begin(), u.params.end(), name) != u.params.end()) fsdp.insert(p.get());
    for (int r = 0; r < n; ++r) {
        int64_t bytes = 0;
        for (const auto& [name, p] : model.named_parameters()) {
            Shape local = tp_local(p.get(), r);
            if (fsdp.count(p.get()) && !local.empty()) local[0] = chunk_of(local[0], ex.dp, 0).length;  // dp rank 0's shard
            bytes += numel_of(local) * static_cast<int64_t>(es);
        }
        ex.param_bytes.push_back(bytes);
        ex.training_bytes.push_back(static_cast<int64_t>(bytes * (2 + state)));
    }
    return ex;
}

}  // namespace ptool
