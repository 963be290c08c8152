#include "parallel/layout_pass.h"

#include <set>

#include "parallel/loss_parallel.h"
#include "parallel/plan.h"

namespace ptool {
namespace {

// Collectives of one call's backward, run in this order; the calls' lists run in the reverse
// order of their forward markers (a container's last marker is its first in backward).
using Marker = std::vector<CommCost>;

class Pass final : public LayoutVisitor {
public:
    Pass(const std::map<const Module*, const ResolvedStyle*>& styles, int parts, SourceLocation plan_where,
         const std::set<const Module*>& checkpointed, DType compute)
        : styles_(styles),
          parts_(parts),
          plan_where_(std::move(plan_where)),
          checkpointed_(checkpointed),
          es_(dtype_size(compute)) {}

    int parts() const override { return parts_; }

    Layout call(const Module& m, const Layout& in) override {
        const size_t index = report.calls.size();
        auto it = styles_.find(&m);
        const ResolvedStyle* rs = it == styles_.end() ? nullptr : it->second;
        report.calls.push_back({&m, m.fqn(), rs, in, {}, static_cast<int>(stack_.size())});
        stack_.push_back(&m);
        const size_t forward_before = report.forward.size();
        Layout out;
        try {
            out = rs ? styled(m, *rs, in) : m.layout(*this, in);
        } catch (const LayoutError& e) {
            throw InputError(producer_where(), explain_conflict(m, in, e));
        }
        stack_.pop_back();
        if (!rs && m.children().empty()) lint_leaf(m, in, {});
        if (rs) producer_ = {fmt::format("'{}'", m.fqn()), rs->entry};
        report.calls[index].out = out;
        if (checkpointed_.count(&m)) {  // its backward starts by running this forward again
            Marker again(report.forward.begin() + static_cast<std::ptrdiff_t>(forward_before),
                         report.forward.end());
            for (CommCost& c : again) c.phase = Phase::backward;
            markers.push_back(std::move(again));
        }
        return out;
    }

    LayoutReport report;
    std::vector<Marker> markers;

private:
    // A placement's shard dim must exist in the tensor it is applied to ("shard(7)" of a 3-d activation).
    static void check_dim(const Placement& p, const Layout& t, const ResolvedStyle& rs, const char* which) {
        const int64_t nd = static_cast<int64_t>(t.global.size());
        if (p.is_shard() && (p.dim >= nd || p.dim < -nd))
            throw InputError(
                rs.entry->where,
                fmt::format("'{}' ({}): shard({}) for its {} is out of range for a {}-d tensor {}", rs.fqn,
                            rs.entry->style.name(), p.dim, which, nd, shape_str(t.global)));
    }

    Layout styled(const Module& m, const ResolvedStyle& rs, const Layout& in) {
        const StyleSpec& spec = rs.entry->style;
        const StyleRule r = spec.style->rule(m, spec);
        const int64_t nd = static_cast<int64_t>(in.global.size());
        if (r.pre) check_dim(r.pre->from, in, rs, "input"), check_dim(r.pre->to, in, rs, "input");
        const size_t es = es_;
        Layout x = in;
        if (r.pre) {
            if (!in.p.same_as(r.pre->from, nd)) declared_input_conflict(m, rs, in, r.pre->from);
            add(report.forward, redistribute_cost(in.p, r.pre->to, in.global, parts_, es), m, Phase::forward);
            x.p = r.pre->to;
        }
        if (m.children().empty()) {  // parameters the style neither distributes nor reduces see only the
                                     // compute input's rows
            std::set<std::string> handled;
            for (const ParamPlacement& pp : spec.style->params(m)) handled.insert(pp.param);
            for (const ParamGradSync& s : spec.style->grad_syncs(m, spec, x)) handled.insert(s.param);
            lint_leaf(m, x, handled);
        }
        const size_t pre_marker = markers.size();
        markers.emplace_back();  // filled below: its gradient's way back runs after the children's
        Layout y = r.compute_out ? Layout{m.output_shape(x.global), *r.compute_out} : m.layout(*this, x);
        Marker back;
        if (r.post) check_dim(r.post->from, y, rs, "output"), check_dim(r.post->to, y, rs, "output");
        if (r.post) {
            if (!y.p.same_as(r.post->from, static_cast<int64_t>(y.global.size())))
                throw InputError(rs.entry->where,
                                 fmt::format("'{}' ({}) declares its output {} but computes {}", m.fqn(),
                                             spec.name(), r.post->from.str(), y.p.str()));
            add(report.forward, redistribute_cost(y.p, r.post->to, y.global, parts_, es), m, Phase::forward);
            add(back,
                redistribute_cost(grad_placement(r.post->to), grad_placement(r.post->from), y.global, parts_,
                                  es),
                m, Phase::backward);
            y.p = r.post->to;
        }
        markers.push_back(std::move(back));
        Marker& first = markers[pre_marker];  // the input gradient, then the parameter gradients
        if (r.pre && spec.save_input_shard)   // the input, gathered again for the weight gradient
            add(first, redistribute_cost(r.pre->from, r.pre->to, in.global, parts_, es), m, Phase::backward);
        if (r.pre)
            add(first,
                redistribute_cost(r.grad_in.value_or(grad_placement(x.p)), grad_placement(r.pre->from),
                                  in.global, parts_, es),
                m, Phase::backward);
        for (const ParamGradSync& s : spec.style->grad_syncs(m, spec, y))
            add(first,
                redistribute_cost(s.from, Placement::replicate(), m.param(s.param)->value.shape(), parts_,
                                  es),
                m, Phase::backward);
        return y;
    }

    static void add(std::vector<CommCost>& list, std::vector<CommCost> costs, const Module& m, Phase phase) {
        for (CommCost& c : costs) c.module = m.fqn(), c.phase = phase, list.push_back(std::move(c));
    }

    [[noreturn]] void declared_input_conflict(const Module& m, const ResolvedStyle& rs, const Layout& in,
                                              const Placement& declared) {
        const Module* parent = stack_.size() >= 2 ? stack_[stack_.size() - 2] : nullptr;
        const bool direct =
            parent && parent->chaining() == Chaining::none;  // attention/gated_mlp pass their input on
        const std::string holder = direct ? parent->fqn() : m.fqn();
        auto lower = [](std::string s) {
            for (char& c : s) c = static_cast<char>(std::tolower(c));
            return s.substr(0, s.find('('));
        };
        const std::string actual = in.p.is_shard() ? fmt::format("shard({})", in.p.dim) : lower(in.p.str());
        const std::string want =
            declared.is_shard() ? fmt::format("shard({})", declared.dim) : lower(declared.str());
        throw InputError(
            rs.entry->where,
            fmt::format("'{}' ({}) takes its input as {} but {} outputs {}: add prepare_input {} -> {} on "
                        "'{}' (or input_layouts: {} on '{}')",
                        m.fqn(), rs.entry->style.name(), declared.str(), producer_.name, in.p.str(), actual,
                        want, holder, actual, m.fqn()));
    }

    // The plan entry of the style that produced the activation (the plan's start for the model input).
    const SourceLocation& producer_where() const {
        return producer_.entry ? producer_.entry->where : plan_where_;
    }

    std::string explain_conflict(const Module& m, const Layout& in, const LayoutError& e) const {
        if (!m.children().empty())
            return fmt::format("{} ({})", e.message(), m.where().str());  // containers say what to do
        return fmt::format("{} outputs {} but {} ({}): give it a style, or have {} output replicate",
                           producer_.name, in.p.str(), e.message(), m.where().str(), producer_.name);
    }

    // A module with parameters fed sequence or batch shards computes its parameter gradients over
    // this rank's rows only; unless its style reduces them (`handled`), nothing does.
    void lint_leaf(const Module& m, const Layout& in, const std::set<std::string>& handled) {
        const Placement p = in.p.normalized(static_cast<int64_t>(in.global.size()));
        bool partial_grads = false;
        for (const auto& e : m.params()) partial_grads = partial_grads || !handled.count(e.name);
        if (p.is_shard() && partial_grads)
            report.warnings.push_back(
                {producer_where(),
                 fmt::format("'{}' ({}) gets {} activations from {}: each rank's gradients of its "
                             "replicated parameters cover only its rows and are not reduced: give it "
                             "sequence_parallel, or gather the activation first",
                             m.fqn(), m.type(), in.p.str(), producer_.name),
                 DiagnosticKind::unreduced_gradients});
    }

    struct Producer {
        std::string name = "the model input";
        const PlanEntry* entry = nullptr;
    };
    const std::map<const Module*, const ResolvedStyle*>& styles_;
    int parts_;
    SourceLocation plan_where_;
    std::vector<const Module*> stack_;
    Producer producer_;
    const std::set<const Module*>& checkpointed_;
    size_t es_;  // bytes per element of what travels: activations and their gradients, in the compute dtype
};

}  // namespace

LayoutReport propagate_layouts(const Model& model,
                               const std::map<const Module*, const ResolvedStyle*>& styles,
                               const Layout& input, int parts, const SourceLocation& plan_where,
                               const LayoutPassOptions& options) {
    Pass pass(styles, parts, plan_where, options.checkpointed, options.compute.value_or(model.dtype));
    const bool loss_parallel = options.loss_parallel;
    pass.report.input = input;
    pass.report.output = pass.call(*model.root, input);
    // the runner gathers the output for the loss and hands the loss's gradient back as the output's;
    // with loss_parallel the loss runs on the shards (parallel/loss_parallel.h); under mixed
    // precision the output is gathered in param_dtype and the loss computed in the model's dtype
    const Layout& out = pass.report.output;
    const size_t es = dtype_size(options.compute.value_or(model.dtype));
    if (loss_parallel && parts > 1) {
        for (const auto& [op, bytes] : vocab_parallel_cross_entropy_cost(out.global, model.dtype))
            pass.report.forward.push_back({op, bytes, "(loss)", Phase::forward});
    } else {
        for (CommCost c : redistribute_cost(out.p, Placement::replicate(), out.global, parts, es))
            c.module = "(loss)", pass.report.forward.push_back(c);
        for (CommCost c :
             redistribute_cost(Placement::replicate(), grad_placement(out.p), out.global, parts, es))
            c.module = "(loss)", c.phase = Phase::backward, pass.report.backward.push_back(c);
    }
    for (auto it = pass.markers.rbegin(); it != pass.markers.rend(); ++it)
        pass.report.backward.insert(pass.report.backward.end(), it->begin(), it->end());
    return std::move(pass.report);
}

}  // namespace ptool
