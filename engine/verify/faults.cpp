#include "verify/faults.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/tensor_ops.h"
#include "core/yaml_reader.h"
#include "model/attention_core.h"
#include "model/float8_gemm.h"
#include "model/routed_experts.h"
#include "verify/fault_comm.h"
#include "verify/fault_hooks.h"

namespace ptool {
namespace {

// The table's rows are in the enum's order, so fault_class is an index.
constexpr bool rows_in_enum_order() {
    for (size_t i = 0; i < std::size(kFaultClasses); ++i)
        if (static_cast<size_t>(kFaultClasses[i].kind) != i) return false;
    return true;
}
static_assert(rows_in_enum_order(), "kFaultClasses: one row per FaultKind, in the enum's order");

class FaultLayer final : public RunLayer {
public:
    explicit FaultLayer(Fault f) : fault_(std::move(f)) {}

    bool needs_full_parameters() const override { return true; }

    void wrap_mesh(DeviceMesh& mesh, const Plan& plan) override {
        plan_ = &plan;
        const int pp = plan.pipeline && plan.dims.has(DimRole::pp) ? plan.dims.index(DimRole::pp) : -1;
        const int ep = plan.expert_parallel && plan.dims.has(DimRole::ep) ? plan.dims.index(DimRole::ep) : -1;
        // grad_scale's rank: the last of the stage (of the world without a pipeline), which holds the
        // stage's parameters; the world's last holds the last stage's only
        last_ = true;
        for (int d = 0; d < mesh.ndim(); ++d)
            if (d != pp && mesh.coord(d) != mesh.dims()[d].size - 1) last_ = false;
        for (int d = 0; d < mesh.ndim(); ++d) {
            if (!plan.dims.role(d)) continue;  // a dim no section uses: nothing of the plan's runs on it
            mesh.wrap(d, [&, d, pp, ep](std::unique_ptr<Communicator> c) {
                return faults::fault_comm(std::move(c), fault_, buckets_, stage_params_, d == pp, d == ep);
            });
        }
        mesh.wrap_groups([&](std::unique_ptr<Communicator> c) {  // fully_shard over dp_shard x cp
            return faults::fault_comm(std::move(c), fault_, buckets_, stage_params_, false);
        });
        // zero_wrong_group: a dp dim's ZeRO buckets reduced over the tp dim where it has the same size
        const bool zero = plan.data_parallel && plan.data_parallel->zero_stage > 0;
        if (fault_.is(FaultKind::zero_wrong_group) && zero && plan.dims.has(DimRole::dp_replicate)) {
            const int dp = plan.dims.index(DimRole::dp_replicate);
            Communicator* other = nullptr;
            if (plan.dims.has(DimRole::tp) &&
                mesh.dims()[plan.dims.index(DimRole::tp)].size == mesh.dims()[dp].size)
                other = &faults::inner_of(mesh.comm(plan.dims.index(DimRole::tp)));
            faults::set_wrong_group(mesh.comm(dp), other);
        }
    }

    // pp_loss_unscaled: a microbatch's loss not divided by the microbatches where it should be (a mean
    // per call), divided where it should not (global_tokens' sum over the step's count)
    double loss_scale(double scale, int64_t microbatches) override {
        if (!fault_.is(FaultKind::pp_loss_unscaled)) return scale;
        return scale == 1.0 ? 1.0 / static_cast<double>(microbatches) : 1.0;
    }

    LossNormalization loss_normalization(LossNormalization n) override {
        return fault_.is(FaultKind::loss_per_call) ? LossNormalization::mean_per_call : n;
    }

    // pp_stage_reinit: the stage's gradients start again at each microbatch's backward
    void before_backward(Model& model, int stage, int /*microbatch*/) override {
        if (!fault_.hits_stage(FaultKind::pp_stage_reinit, stage)) return;
        for (const auto& [name, p] : model.named_parameters())
            if (stage_params_.held.count(p.get()) && p->grad.numel() > 0)
                backend_for(p->grad.device()).fill(p->grad, 0.0);
    }

    // The W faults act on the microbatch of each stage's first W in the lists the run was given
    // (the same one whatever a later change of the lists, verify's localisation probes, makes
    // first); pp_weight_before_input moves that W to just before its I.
    void schedule(Schedule& s) override {
        if (first_weight_.empty())
            for (const std::vector<Action>& list : s.ranks)
                for (const Action& a : list)
                    if (a.kind == ActionKind::backward_weight) first_weight_.emplace(a.stage, a.microbatch);
        if (!fault_.kind || *fault_.kind != FaultKind::pp_weight_before_input) return;
        for (std::vector<Action>& list : s.ranks) {
            auto w = std::find_if(list.begin(), list.end(), [&](const Action& a) {
                return a.kind == ActionKind::backward_weight &&
                       fault_.hits_stage(FaultKind::pp_weight_before_input, a.stage);
            });
            if (w == list.end()) continue;
            auto i = std::find_if(list.begin(), w, [&](const Action& a) {
                return a.kind == ActionKind::backward_input && a.stage == w->stage &&
                       a.microbatch == w->microbatch;
            });
            if (i != w) std::rotate(i, w, w + 1);
        }
    }

    WeightFault weight_fault(int stage, int microbatch) override {
        if (auto it = first_weight_.find(stage); it == first_weight_.end() || it->second != microbatch)
            return WeightFault::none;
        static constexpr std::pair<FaultKind, WeightFault> kinds[] = {
            {FaultKind::pp_weight_skipped, WeightFault::skipped},
            {FaultKind::pp_weight_doubled, WeightFault::doubled},
            {FaultKind::pp_weight_freed_input, WeightFault::freed_input},
        };
        for (const auto& [kind, fault] : kinds)
            if (fault_.hits_stage(kind, stage)) return fault;
        return WeightFault::none;
    }

    double clip_norm(double norm, int64_t microbatches) override {
        return fault_.is(FaultKind::grad_norm_per_microbatch) ? norm / static_cast<double>(microbatches)
                                                              : norm;
    }

    std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> c,
                                             const std::string& param) override {
        if (!fault_.hits(FaultKind::pp_tied_unsynced, param)) return c;
        return faults::fault_comm(std::move(c), fault_, buckets_, stage_params_);
    }

    // The pipeline faults act on the stage their argument names, wherever this rank holds it (under
    // interleaved_1f1b a rank holds several): its first module, its parameters.
    void held_stages(const std::vector<std::pair<int, std::vector<Module*>>>& stages) override {
        for (const auto& [index, modules] : stages) {
            if (!fault_.kind || fault_class(*fault_.kind).section != FaultSection::pipeline ||
                !fault_.hits_stage(*fault_.kind, index))
                continue;
            if (index > 0 && !modules.empty()) fault_stage_firsts_.push_back(modules.front());
            for (Module* m : modules)
                for_each_param(
                    *m, [&](const std::string&, const ParamPtr& p) { stage_params_.held.insert(p.get()); });
        }
    }

    void before_parallelize(const Model& model, const Resolution& res) override {
        for (const ResolvedStyle& rs : res.styles)
            if (fault_.hits(FaultKind::wrong_shard_dim, rs.fqn) ||
                fault_.hits(FaultKind::wrong_shard_offset, rs.fqn))
                for (const ParamPlacement& pp : rs.entry->style.style->params(*rs.module))
                    if (pp.placement.is_shard())
                        full_[rs.module->param(pp.param).get()] = rs.module->param(pp.param)->value.clone();
        (void)model;
    }

    void after_parallelize(Model& model, const Plan& plan, const Resolution& res, const TpParams& params,
                           DeviceMesh& mesh) override;

    DataParallelResolution data_parallel(const DataParallelResolution& r) override;
    ExpertParallelResolution expert_parallel(const ExpertParallelResolution& r) override {
        ExpertParallelResolution out = r;
        for (const std::string& layer : r.layers)
            if (fault_.hits(FaultKind::ep_grads_wrong_group, layer)) out.wrong_scale.insert(layer);
        if (fault_.is(FaultKind::loss_per_call)) out.grad_reduce = ReduceOp::avg;
        return out;
    }

    // float8_master: a float8 linear's weight, as this rank holds it, rounded to e4m3fn after each step
    void after_optimizer_step(Model& model) override {
        if (!fault_.is(FaultKind::float8_master)) return;
        for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
            const ParamPtr w = m.float8() ? m.param("weight") : nullptr;
            if (!w || !fault_.hits(FaultKind::float8_master, fqn) || w->value.device() == Device::meta)
                return;
            const Float8Operand kept =
                float8_tensorwise(w->value, Float8Format::e4m3fn, float8_amax(w->value));
            Backend& be = backend_for(w->value.device());
            Tensor back(kept.values.shape(), DType::float32, w->value.device());
            be.axpy(1.0 / kept.scale, kept.values, back);
            be.copy(back, w->value);
        });
    }

    void before_gradient_sync(Model& model, Communicator&) override {
        // torch's schedule.step(scale_grads) divides the stage's gradients by its microbatches: again
        const bool twice = fault_.is(FaultKind::pp_grad_scaled_twice);  // stage_params_: the stage's, if held
        const double microbatches =
            plan_ ? static_cast<double>(plan_->microbatches_per_round() * plan_->accumulation_rounds(model))
                  : 1.0;
        for (const auto& [name, p] : model.named_parameters()) {
            Backend& be = backend_for(p->grad.device());
            if (twice && stage_params_.held.count(p.get())) be.scale(p->grad, 1.0 / microbatches, p->grad);
            if (fault_.hits(FaultKind::grad_scale, name) && last_) be.scale(p->grad, 1.001, p->grad);
            if (fault_.is(FaultKind::masters_rounded) && plan_ &&
                plan_->mixed_precision)  // the optimizer steps param_dtype values
                be.copy(to_dtype(be, p->value, plan_->mixed_precision->param_dtype), p->value);
        }
    }

private:
    Fault fault_;
    std::map<int, int> first_weight_;  // stage -> the microbatch of its first W (schedule())
    const Plan* plan_ = nullptr;
    bool last_ = false;  // the stage's last rank (the world's without a pipeline)
    faults::FaultBuckets buckets_;
    // a pipeline fault's stages (one, or every one for *) this rank holds: the first module of each
    // but stage 0 (pp_stale_activation's), their parameters
    std::vector<Module*> fault_stage_firsts_;
    faults::StageParams stage_params_;
    std::map<const Parameter*, Tensor> full_;
};

// wrong_shard_offset: the rank's chunk one row later (earlier at the end); wrong_shard_dim: the
// chunk along the other dim poured into this shard's shape.
Tensor wrong_shard(const Fault& f, const Tensor& full, int64_t dim, int n, int r, const Tensor& local) {
    if (local.numel() == 0) return local;
    if (f.is(FaultKind::wrong_shard_offset)) {
        const Chunk c = chunk_of(full.size(dim), n, r);
        const int64_t start = c.offset + c.length < full.size(dim) ? c.offset + 1 : c.offset - 1;
        return start >= 0 ? full.narrow(dim, start, c.length).clone() : local;
    }
    if (full.dim() != 2) return local;
    const Tensor other = chunk(full, n, r, 1 - dim);
    Tensor out = local.clone();
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, other.numel() ? other.item(i % other.numel()) : 0.0);
    return out;
}

void FaultLayer::after_parallelize(Model& model, const Plan& plan, const Resolution& res,
                                   const TpParams& params, DeviceMesh& mesh) {
    if (fault_.is(FaultKind::skip_buffer_broadcast) && plan.data_parallel) {
        // the replicas start apart, as DDP's do before its broadcast, and the broadcast never comes
        int dp_rank = 0;  // among every data rank
        for (int d : plan.dims.data_dims()) dp_rank = dp_rank * mesh.dims()[d].size + mesh.coord(d);
        for (const auto& [name, b] : model.named_buffers())
            if (dp_rank != 0 && res.dp.synced_buffers.count(name)) poison_replica(b->value, dp_rank);
    }
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {  // the float8 recipe's seams
        const Float8Gemms* f = m.float8();
        const bool local = fault_.hits(FaultKind::float8_local_amax, fqn),
                   e4m3 = fault_.hits(FaultKind::float8_e4m3_grad, fqn),
                   unrounded = fault_.hits(FaultKind::float8_scale_unrounded, fqn);
        if (!f || !(local || e4m3 || unrounded)) return;
        Float8Gemms g = *f;
        if (local) g.recipe.reduce_amax = false;
        if (e4m3) g.recipe.grad_output = Float8Format::e4m3fn;
        if (unrounded) g.recipe.power_of_2_scales = false;
        m.set_float8(g);
    });
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        const bool dropout = m.drop_probability().has_value();
        if (fault_.hits(FaultKind::tied_grad, fqn) ||
            (m.attention_core() && fault_.hits(FaultKind::cp_balance_noncausal, fqn)) ||
            (dropout &&
             (fault_.hits(FaultKind::dropout_same_mask, fqn) || fault_.hits(FaultKind::recompute_mask, fqn))))
            m.add_outer_hooks(faults::module_fault_hooks(*fault_.kind));
    });
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        if (m.attention_core() && (fault_.hits(FaultKind::cp_position_offset, fqn) ||
                                   fault_.hits(FaultKind::cp_permutation_kept, fqn) ||
                                   fault_.hits(FaultKind::cp_mask_unshifted, fqn) ||
                                   fault_.hits(FaultKind::cp_merge_unscaled, fqn)))
            m.add_outer_hooks(faults::context_fault_hooks(*fault_.kind));
    });
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        RoutedExperts* moe = m.routed_experts();
        if (!moe) return;
        if (fault_.hits(FaultKind::moe_router_unnormalised, fqn))
            moe->set_router(faults::unnormalised_router());
        if (fault_.hits(FaultKind::moe_aux_unreduced, fqn)) moe->set_router(faults::local_balance_router());
        for (FaultKind k :
             {FaultKind::ep_split_sizes, FaultKind::ep_combine_unpermuted, FaultKind::ep_expert_misplaced})
            if (fault_.hits(k, fqn)) moe->set_dispatch(faults::fault_dispatch(k));
    });
    if (fault_.is(FaultKind::sac_stale_output))  // every op under the region the fault names
        for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
            if (!m.selective() || !fault_.hits(FaultKind::sac_stale_output, fqn)) return;
            for_each_module(m, [&](const std::string&, Module& op) {
                if (op.kept_outputs()) op.add_outer_hooks(faults::stale_kept_hooks());
            });
        });
    if (fault_.is(FaultKind::pp_stale_activation))
        for (Module* first : fault_stage_firsts_) first->add_outer_hooks(faults::stale_input_hooks());
    if (!stage_params_.held.empty())  // pp_stage_sync_skipped's names of the stage's parameters
        for (const auto& [name, p] : model.named_parameters())
            if (stage_params_.held.count(p.get())) stage_params_.params.insert(name);
    if (!plan.dims.has(DimRole::tp)) return;
    Communicator& tp = mesh.comm(plan.dims.index(DimRole::tp));
    for (const ResolvedStyle& rs : res.styles) {
        if (fault_.hits(FaultKind::skip_all_reduce, rs.fqn) ||
            fault_.hits(FaultKind::bias_every_rank, rs.fqn) ||
            fault_.hits(FaultKind::skip_grad_all_reduce, rs.fqn))
            rs.module->set_hooks(faults::style_fault_hooks(rs.module->hooks(), *fault_.kind, tp.size()));
        // moe_tp_grad_unreduced: a moe layer's routed experts' partial input gradients kept as they are
        if (const size_t at = rs.fqn.find(".experts.");
            at != std::string::npos && fault_.hits(FaultKind::moe_tp_grad_unreduced, rs.fqn.substr(0, at)))
            rs.module->set_hooks(
                faults::style_fault_hooks(rs.module->hooks(), FaultKind::skip_grad_all_reduce, tp.size()));
        for (const auto& [pp, full] : full_) {
            const ParamPtr p = rs.module->param("weight") && rs.module->param("weight").get() == pp
                                   ? rs.module->param("weight")
                               : rs.module->param("bias") && rs.module->param("bias").get() == pp
                                   ? rs.module->param("bias")
                                   : nullptr;
            if (!p) continue;
            const int64_t dim = normalize_dim(params.at(pp).placement.dim, full.dim());
            p->value = wrong_shard(fault_, full, dim, tp.size(), tp.rank(), p->value);
        }
    }
}

DataParallelResolution FaultLayer::data_parallel(const DataParallelResolution& r) {
    DataParallelResolution out = r;
    if (fault_.is(FaultKind::loss_per_call)) out.grad_reduce = ReduceOp::avg;  // DDP's average of the means
    if (fault_.is(FaultKind::skip_buffer_broadcast)) out.synced_buffers.clear();
    if (fault_.is(FaultKind::zero_wrong_offset) && out.zero_stage > 0) out.zero_rotation = 1;
    for (const FsdpUnitSpec& u : out.units)  // a weight's precomputed float8 scale taken before the step
        for (const std::string& name : u.params)
            if (name.size() > 7 && name.ends_with(".weight") &&
                fault_.hits(FaultKind::float8_stale_scale, name.substr(0, name.size() - 7)))
                out.float8_stale_scales.insert(name);
    if (fault_.is(FaultKind::ep_shared_unsynced)) {  // the shared expert's parameters synchronised by no one
        auto shared = [&](const std::string& name) {
            return fault_.fqn == "*" ? name.find(".shared_expert.") != std::string::npos
                                     : name.rfind(fault_.fqn + ".shared_expert.", 0) == 0;
        };
        for (auto& replica : out.replicas)
            for (BucketSpec& b : replica.buckets) std::erase_if(b.params, shared);
        for (FsdpUnitSpec& u : out.units) std::erase_if(u.params, shared);
    }
    if (fault_.is(FaultKind::sync_ignored) &&
        !out.ignored_params.empty()) {  // averaged in a bucket of their own
        if (out.replicas.empty()) out.replicas.push_back({"", {}});
        BucketSpec b;
        b.params.assign(out.ignored_params.begin(), out.ignored_params.end());
        out.replicas[0].buckets.push_back(b);
        out.ignored_params.clear();
    }
    auto of_stage = [&](const std::vector<std::string>& params) {
        return std::any_of(params.begin(), params.end(),
                           [&](const std::string& q) { return stage_params_.params.count(q) > 0; });
    };
    for (const auto& replica : out.replicas)  // skip_bucket: which bucket K of a root holds the parameter
        for (const BucketSpec& b : replica.buckets) {
            const bool holds = std::find(b.params.begin(), b.params.end(), fault_.fqn) != b.params.end();
            buckets_[replica.root].push_back(holds ? fault_.fqn : std::string());
            stage_params_.buckets[replica.root].push_back(of_stage(b.params));
        }
    for (const FsdpUnitSpec& u : out.units)
        if (of_stage(u.params)) stage_params_.units.insert(u.fqn);
    return out;
}

}  // namespace

const FaultClass& fault_class(FaultKind k) {
    return kFaultClasses[static_cast<size_t>(k)];
}

const char* fault_section_name(FaultSection s) {
    switch (s) {
        case FaultSection::tensor_parallel:
            return "tensor parallel";
        case FaultSection::data_parallel:
            return "data parallel";
        case FaultSection::training:
            return "training configurations";
        case FaultSection::mixed_precision:
            return "mixed precision";
        case FaultSection::pipeline:
            return "pipeline parallel";
        case FaultSection::context:
            return "context parallel";
        case FaultSection::experts:
            return "mixture of experts";
    }
    return "";
}

Fault parse_fault(const char* text) {
    Fault f;
    if (!text || !*text) return f;
    const std::string s(text);
    const size_t colon = s.find(':');
    const std::string kind = s.substr(0, colon);
    f.fqn = colon == std::string::npos ? "" : s.substr(colon + 1);
    std::vector<std::string> names;
    for (const FaultClass& c : kFaultClasses) {
        names.push_back(c.name);
        if (kind == c.name) f.kind = c.kind;
    }
    if (!f.kind || f.fqn.empty())
        throw InputError(
            fmt::format("PTOOL_FAULT='{}': expected KIND:FQN (or KIND:* for every place) with KIND one of {}",
                        s, fmt::join(names, ", ")));
    return f;
}

void check_fault_target(const Fault& f, const Model& model, const Plan& plan) {
    if (f.empty() || f.fqn == "*") return;
    const std::string target = fault_class(*f.kind).target;
    if (target == "*") return;       // a kind that breaks the whole run: its FQN is not read
    std::vector<std::string> names;  // the places of its kind in this model and plan
    std::string what = "module of the model";
    if (target == "STAGE") {
        for (int s = 0; plan.pipeline && s < plan.pipeline_stages(); ++s) names.push_back(std::to_string(s));
        what = plan.pipeline ? fmt::format("stage of the plan's {} (0..{})", names.size(), names.size() - 1)
                             : "stage: the plan has no pipeline";
    } else if (target == "PARAM") {
        for (const auto& [name, p] : model.state_dict()) names.push_back(name);
        what = "parameter of the model";
    } else {
        for (const auto& [fqn, m] : named_modules(*model.root))
            if (!fqn.empty()) names.push_back(fqn);
    }
    if (std::find(names.begin(), names.end(), f.fqn) != names.end()) return;
    throw InputError(fmt::format(
        "PTOOL_FAULT='{}:{}': '{}' is no {}, so the fault would break nothing and the run pass untouched "
        "({} names a {}; * for every place){}",
        fault_class(*f.kind).name, f.fqn, f.fqn, what, fault_class(*f.kind).name, target,
        did_you_mean(f.fqn, names)));
}

std::unique_ptr<RunLayer> fault_layer(const Fault& fault) {
    if (fault.empty()) return nullptr;
    return std::make_unique<FaultLayer>(fault);
}

}  // namespace ptool
