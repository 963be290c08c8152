#include "parallel/data_parallel.h"

#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/fqn_pattern.h"
#include "core/rng.h"
#include "core/tensor_ops.h"
#include "core/yaml_reader.h"
#include "parallel/expert_parallel.h"
#include "parallel/mixed_precision.h"

namespace ptool {

std::vector<BucketSpec> assign_buckets(const std::vector<std::pair<std::string, int64_t>>& params_and_bytes,
                                       int64_t cap_bytes) {
    std::vector<BucketSpec> out;
    BucketSpec open;
    for (auto it = params_and_bytes.rbegin(); it != params_and_bytes.rend(); ++it) {
        open.params.push_back(it->first);
        open.bytes += it->second;
        if (open.bytes >= cap_bytes) out.push_back(std::move(open)), open = BucketSpec{};
    }
    if (!open.params.empty()) out.push_back(std::move(open));
    return out;
}

namespace {

// The global batch splits evenly over the dp ranks (every microbatch does, under accumulation; a
// plan's own rounds are check_microbatches', at its key).
void check_batch_split(const Model& model, const Plan& plan, const DataParallelSpec& spec, int size) {
    const int64_t rows = model.input.shape.empty() ? 1 : model.input.shape[0],
                  rounds = plan.accumulation_rounds(model);
    if (plan.gradient_accumulation == 0 && rounds > 1 && rows % (size * rounds) != 0)
        throw InputError(
            spec.where,
            fmt::format("each of the {} microbatches of {} rows (gradient_accumulation) does not split "
                        "evenly over the {} ranks of '{}'",
                        rounds, rows / rounds, size, spec.mesh_dim_names()));
    if (rows % size != 0) {
        std::vector<int64_t> sizes;
        for (int r = 0; r < size; ++r) sizes.push_back(chunk_of(rows, size, r).length);
        throw InputError(spec.where,
                         fmt::format("the global batch of {} rows does not split evenly over the {} ranks of "
                                     "'{}' (rows per rank: {}): make the batch a multiple of {}",
                                     rows, size, spec.mesh_dim_names(), fmt::join(sizes, ", "), size));
    }
}

// fully_shard units: the listed patterns, and the root in mode fully_shard; outermost first.
std::vector<std::string> fsdp_unit_fqns(const DataParallelSpec& spec,
                                        const std::vector<std::string>& module_names,
                                        std::vector<Diagnostic>& warnings) {
    std::vector<std::string> unit_fqns;
    std::set<std::string> units;  // unit_fqns', once each
    if (spec.mode == DataParallelMode::fully_shard) unit_fqns.push_back(""), units.insert("");
    const NameIndex index(module_names);
    std::set<std::string> listed;
    for (const std::string& pattern : spec.fully_shard) {
        if (!listed.insert(pattern).second) {  // (its modules are units already: "matched no module")
            warnings.push_back({spec.fully_shard_where,
                                fmt::format("fully_shard pattern '{}' is listed twice", pattern),
                                DiagnosticKind::no_effect});
            continue;
        }
        int matched = 0;
        for (const size_t i : index.matches(pattern))
            if (units.insert(module_names[i]).second) unit_fqns.push_back(module_names[i]), ++matched;
        if (!matched)
            warnings.push_back({spec.fully_shard_where,
                                fmt::format("fully_shard pattern '{}' matched no module", pattern),
                                DiagnosticKind::unmatched_pattern});
    }
    std::stable_sort(unit_fqns.begin(), unit_fqns.end(), [](const std::string& a, const std::string& b) {
        return (a.empty() ? 0 : std::count(a.begin(), a.end(), '.') + 1) <
               (b.empty() ? 0 : std::count(b.begin(), b.end(), '.') + 1);
    });
    return unit_fqns;
}

// ignored_modules and replicate() roots name modules; no root inside another.
void check_roots(const DataParallelSpec& spec, const std::vector<std::string>& module_names) {
    auto check_module = [&](const std::string& fqn, const SourceLocation& where, const char* what) {
        if (std::find(module_names.begin(), module_names.end(), fqn) == module_names.end())
            throw InputError(where, fmt::format("{} '{}' is not a module of the model{}", what, fqn,
                                                did_you_mean(fqn, module_names)));
    };
    for (const std::string& m : spec.ignored_modules) check_module(m, spec.ignored_where, "ignored module");
    if (spec.mode != DataParallelMode::replicate) return;
    for (size_t i = 0; i < spec.modules.size(); ++i) {
        check_module(spec.modules[i], spec.modules_where, "replicate() module");
        for (size_t j = 0; j < spec.modules.size(); ++j)
            if (i != j && fqn_under(spec.modules[j], spec.modules[i]))
                throw InputError(spec.modules_where,
                                 fmt::format("replicate() on '{}' and on '{}' inside it: a "
                                             "parameter belongs to one replicate() root",
                                             spec.modules[i], spec.modules[j]));
    }
}

// The innermost fully_shard unit over `fqn` (units are outermost first: the last match), or null.
template <class Units>
auto innermost_unit(Units& units, const std::string& fqn) -> decltype(&units.front()) {
    decltype(&units.front()) unit = nullptr;
    for (auto& u : units)
        if (fqn_under(fqn, u.fqn)) unit = &u;
    return unit;
}

}  // namespace

void check_tied_units(const Model& model, const Plan& plan, const DataParallelResolution& res,
                      bool stage_model) {
    if (res.units.empty() || (plan.pipeline && !stage_model)) return;
    const DataParallelSpec& spec = *plan.data_parallel;
    // every call-site name of every module (a `shared` module under each of its names): a unit's
    // hooks are on its module object, so a weight's call site is in the unit whose module lies on
    // its path, under whichever name it is called
    std::map<std::string, const Module*> module_at;
    std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& n) {
        module_at.emplace(n, &m);
        for (const auto& [name, child] : m.children()) walk(*child, join_name(n, name));
    };
    walk(*model.root, "");
    std::map<const Module*, std::string> unit_named;  // a unit's module -> its FQN
    for (const FsdpUnitSpec& u : res.units)
        if (auto it = module_at.find(u.fqn); it != module_at.end()) unit_named[it->second] = u.fqn;
    auto unit_of = [&](std::string fqn) {  // the innermost unit on the call site's path
        for (;;) {
            if (auto m = module_at.find(fqn); m != module_at.end())
                if (auto u = unit_named.find(m->second); u != unit_named.end()) return u->second;
            if (fqn.empty()) return std::string("(none)");
            const size_t dot = fqn.rfind('.');
            fqn = dot == std::string::npos ? std::string() : fqn.substr(0, dot);
        }
    };
    // every name of every weight: a tie's two modules, or a `shared` module under each call site
    // (for_each_module sees a module once, under its first name, and let a shared one called from
    // outside its unit through: it computed on its unit's resharded shard, an internal error)
    std::map<const Parameter*, std::string> first;  // weight -> the module that first holds it
    for_each_param(*model.root, [&](const std::string& name, const ParamPtr& p) {
        if (res.expert_params.count(name) || fqn_under_any(name, spec.ignored_modules)) return;
        const size_t dot = name.rfind('.');
        const std::string fqn = dot == std::string::npos ? std::string() : name.substr(0, dot);
        // (the units looked up for a weight seen twice only: the others are every parameter)
        auto [it, fresh] = first.try_emplace(p.get(), fqn);
        if (fresh || it->second == fqn || unit_of(it->second) == unit_of(fqn)) return;
        auto unit_name = [](const std::string& u) {
            return u.empty() ? std::string("the root's") : "'" + u + "'";
        };
        throw InputError(
            spec.fully_shard_where,
            fmt::format("'{}' and '{}' share one weight (a tie, or a `shared` module called "
                        "under both names) in two fully_shard units ({} and {}): FSDP2 "
                        "shards it with the unit that claims it first and the other would "
                        "compute on its shard; put both in one unit (torchtitan leaves tied "
                        "embeddings to the root's)",
                        it->second, fqn, unit_name(unit_of(it->second)), unit_name(unit_of(fqn))));
    });
}

namespace {

// Each parameter: ignored, managed by its innermost unit, or in the bucket of its replicate()
// root; returns the unmanaged ones (ignored, or under no unit and no root).
std::vector<std::string> assign_parameters(const Model& model, const DataParallelSpec& spec,
                                           DataParallelResolution& res) {
    std::map<std::string, std::vector<std::pair<std::string, int64_t>>> per_root;
    std::vector<std::string> unmanaged;
    for (const auto& [name, p] : model.named_parameters()) {
        if (res.expert_params.count(name)) continue;  // expert parallel's
        if (fqn_under_any(name, spec.ignored_modules)) {
            res.ignored_params.insert(name);
            unmanaged.push_back(name);
            continue;
        }
        if (FsdpUnitSpec* unit = innermost_unit(res.units, name)) {
            unit->params.push_back(name);
            continue;
        }
        bool replicated = false;
        for (const std::string& root : spec.modules)
            if (spec.mode == DataParallelMode::replicate && fqn_under(name, root)) {
                per_root[root].push_back({name, static_cast<int64_t>(p->value.nbytes())});
                replicated = true;
            }
        if (!replicated) unmanaged.push_back(name);
    }
    const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(spec.bucket_cap_mb * 1024 * 1024));
    if (spec.mode == DataParallelMode::replicate)
        for (const std::string& root : spec.modules)
            res.replicas.push_back({root, assign_buckets(per_root[root], cap)});
    if (spec.mode == DataParallelMode::replicate && spec.broadcast_buffers)
        for (const auto& [name, b] : model.named_buffers()) {
            if (fqn_under_any(name, spec.modules) && !fqn_under_any(name, spec.ignored_modules))
                res.synced_buffers.insert(name);
        }
    return unmanaged;
}

// fully_shard of the experts over dp_shard where ep borrows dp_replicate: the ranks of a dp_shard
// group own the same experts (they share their ep coordinate), so each moe layer's are one unit
// over it. Where ep borrows the shard dim itself, each rank holds its experts whole, as
// torchtitan's fully_shard over a dp_shard_mod_ep of 1.
void add_expert_units(const Model& model, const Plan& plan, const ExpertParallelResolution& ep,
                      DataParallelResolution& res) {
    const ParallelDims& dims = plan.dims;
    if (!ep.active || plan.data_parallel->mode != DataParallelMode::fully_shard ||
        !dims.has(DimRole::dp_shard) || dims.index(DimRole::ep) == dims.index(DimRole::dp_shard))
        return;
    res.experts_sharded = true;
    for (const std::string& layer : ep.layers) {
        FsdpUnitSpec u{layer + ".experts", {}, true};
        for (const auto& [name, p] : model.named_parameters())  // in registration order
            if (ep.owner.count(name) && fqn_under(name, u.fqn)) u.params.push_back(name);
        res.units.push_back(std::move(u));
    }
}

// What makes a correct data-parallel run differ from the reference, said before it runs.
void expected_causes(const Model& model, const DataParallelSpec& spec, const DataParallelResolution& res,
                     std::vector<Diagnostic>& causes) {
    if (res.size <= 1) return;
    if (model.loss == LossKind::sum)
        causes.push_back(
            {spec.where, fmt::format("loss: sum under data parallel: each rank sums its own part of the "
                                     "batch and DDP averages the gradients over the {} ranks, so they come "
                                     "out 1/{} of the reference's (use loss: mean or mse)",
                                     res.size, res.size)});
    if (!spec.sync_batch_norm)
        for (const std::string& bn : res.batch_norms)
            causes.push_back(
                {spec.where, fmt::format("batch_norm '{}' normalises with the statistics of each rank's "
                                         "local batch (sync_batch_norm: false): its output, everything "
                                         "after it and its running statistics differ from the reference "
                                         "(sync_batch_norm: true gives parity)",
                                         bn)});
    if (!spec.ignored_modules.empty())
        causes.push_back(
            {spec.ignored_where, fmt::format("ignored_modules [{}]: their gradients are not averaged, so "
                                             "they and then their parameters differ across ranks, and "
                                             "after the first step so does everything computed from them",
                                             fmt::join(spec.ignored_modules, ", "))});
}

}  // namespace

DataParallelResolution resolve_data_parallel(const Model& model, const Plan& plan,
                                             std::vector<Diagnostic>& warnings,
                                             std::vector<Diagnostic>& causes) {
    DataParallelResolution res;
    if (!plan.data_parallel) return res;
    const DataParallelSpec& spec = *plan.data_parallel;
    res.active = true;
    res.size = plan.dims.data_size();
    res.grad_reduce = plan.gradient_reduction(model);
    std::vector<std::string> module_names;
    for_each_module(*model.root, [&](const std::string& fqn, Module& m) {
        module_names.push_back(fqn);
        if (m.batch_statistics()) res.batch_norms.push_back(fqn);
    });
    check_batch_split(model, plan, spec, res.size);
    if (plan.mixed_precision && spec.gradient_as_bucket_view &&
        plan.mixed_precision->reduce_dtype != model.dtype)
        throw InputError(
            plan.mixed_precision->where,
            fmt::format("gradient_as_bucket_view makes the gradients ({}) views of the buckets, which hold "
                        "reduce_dtype {}: drop one of them",
                        dtype_name(model.dtype), dtype_name(plan.mixed_precision->reduce_dtype)));
    for (const std::string& u : fsdp_unit_fqns(spec, module_names, warnings)) res.units.push_back({u, {}});
    check_roots(spec, module_names);
    // (the model may be a pipeline stage's part: resolve_plan refused a whole model without experts)
    const ExpertParallelResolution ep = resolve_expert_parallel(model, plan, false);
    for (const auto& [name, owner] : ep.owner) res.expert_params.insert(name);
    check_tied_units(model, plan, res);
    check_mixed_precision(model, plan, assign_parameters(model, spec, res));
    add_expert_units(model, plan, ep, res);
    res.zero_stage = spec.zero_stage;
    expected_causes(model, spec, res, causes);
    return res;
}

void poison_replica(Tensor& t, int rank) {  // t := 0.25 + rank - t / 2
    if (t.device() == Device::meta) return;
    if (t.dtype() == DType::int64 ||
        t.dtype() == DType::int32) {  // counters (num_batches_tracked): few elements
        for (int64_t k = 0; k < t.numel(); ++k) t.set(k, t.item(k) + 1 + rank);
        return;
    }
    Tensor shift = Tensor::empty(t.shape(), t.dtype(), t.device());
    poison_into(t, rank, shift);
    backend_for(t.device()).copy(shift, t);
}

void poison_into(const Tensor& t, int rank, Tensor& out) {  // out := 0.25 + rank - t / 2
    Backend& be = backend_for(t.device());
    be.fill(out, 0.25 + rank);
    be.axpy(-0.5, t, out);
}

std::vector<BroadcastState> construction_broadcast(const DataParallelResolution& res) {
    std::vector<BroadcastState> out;
    for (const auto& replica : res.replicas)
        for (const BucketSpec& b : replica.buckets)
            for (const std::string& name : b.params) out.push_back({name, false});
    for (const std::string& name : res.synced_buffers) out.push_back({name, true});
    return out;
}

DataParallel::DataParallel(Model& model, const Plan& plan, const DataParallelResolution& res,
                           DeviceMesh& mesh, Communicator& batch, Backend& be)
    : res_(res), counter_(mesh.counter()), be_(be) {
    const DataParallelSpec& spec = *plan.data_parallel;
    const ParallelDims& dims = plan.dims;
    shard_dim_ = dims.shard_dim();
    comm_ = &mesh.comm(shard_dim_);  // one dim (replicate, or fully_shard); HSDP's replicate() has no buckets
    bucket_view_ = spec.gradient_as_bucket_view;
    const auto named_params = model.named_parameters(), named_buffers = model.named_buffers();
    std::map<std::string, ParamPtr> params(named_params.begin(), named_params.end());
    std::map<std::string, ParamPtr> buffers(named_buffers.begin(), named_buffers.end());

    if (spec.sync_batch_norm)
        for_each_module(*model.root, [&](const std::string&, Module& m) {
            if (BatchStatistics* bn = m.batch_statistics()) bn->set_sync_group(&batch);
        });

    // DDP's construction: dp rank 0's parameters and buffers to every rank. The other ranks start
    // from deliberately different values (as the seed's test seeds each rank with its rank), so a
    // broadcast that does not happen shows up as replicas that differ.
    std::vector<ParamPtr> states;
    for (const BroadcastState& s : construction_broadcast(res)) {
        states.push_back(s.buffer ? buffers.at(s.name) : params.at(s.name));
        if (s.buffer) buffers_.push_back(states.back());
    }
    {
        CommScope scope(counter_.get(), spec.modules.size() == 1 ? spec.modules[0] : "",
                        CommSiteKind::construction);
        broadcast_coalesced(states, comm_->rank() != 0);
    }

    // the buckets: flat buffers per replicate() root, in reduction order
    for (const auto& replica : res.replicas)
        for (const BucketSpec& spec_b : replica.buckets) {
            Bucket b;
            b.root = replica.root;
            int64_t numel = 0;
            for (const std::string& name : spec_b.params) {
                b.params.push_back(params.at(name));
                b.names.push_back(name);
                numel += params.at(name)->grad.numel();
            }
            // uninitialised: every step writes it whole (gradients copied in, or zeroed as its views); in
            // mixed precision's reduce_dtype (the copies in and out convert). ZeRO-2 reduce_scatters
            // from a buffer of its own, for the time of the collective.
            const DType dt =
                plan.mixed_precision ? plan.mixed_precision->reduce_dtype : b.params[0]->grad.dtype();
            MemoryUseScope use(MemoryUse::buckets);
            if (res.zero_stage < 2) b.flat = Tensor::empty({numel}, dt, b.params[0]->grad.device());
            if (bucket_view_) {  // the gradients become views of the bucket: no copies
                int64_t off = 0;
                for (const ParamPtr& p : b.params) {
                    const int64_t n = p->grad.numel();
                    p->grad = b.flat.narrow(0, off, n).reshape(p->grad.shape());
                    off += n;
                }
            }
            buckets_.push_back(std::move(b));
        }
    if (res.zero_stage > 0) {
        std::vector<ZeroOptimizer::Bucket> zb;
        std::map<std::string, int> index;  // of each bucket within its root
        for (const Bucket& b : buckets_) zb.push_back({b.root, index[b.root]++, b.params});
        const DType reduce = plan.mixed_precision ? plan.mixed_precision->reduce_dtype : model.dtype;
        zero_ = std::make_unique<ZeroOptimizer>(res.zero_stage, res.zero_rotation, std::move(zb), *comm_, be,
                                                reduce, res.grad_reduce);
    }
    if (!res.units.empty()) {
        Communicator* replicas = spec.hybrid() ? &mesh.comm(dims.index(DimRole::dp_replicate)) : nullptr;
        // under context parallel the cp ranks join the shard group (torchtitan's dp_shard_cp): each
        // parameter's rows chunk over the flattened group, unevenly where they do not cut (97 rows over
        // 2 x 2: 25, 25, 25, 22), as FSDP2's (Run::placements joins cp to the shard dim so)
        Communicator* shard =
            dims.cp_shards_params() ? mesh.group(dims.group(GroupName::dp_shard_cp)) : comm_;
        // FSDP2's float8 all-gather of the float8 linears' weights (the plan's float8 section)
        std::optional<FsdpFloat8> float8;
        if (float8_all_gathers(plan, res))
            float8 = FsdpFloat8{dims.has(DimRole::tp) ? &mesh.comm(dims.index(DimRole::tp)) : nullptr,
                                res.float8_stale_scales};
        fsdp_ = std::make_unique<FullyShard>(
            model, res.units, *shard, replicas, be, plan.mixed_precision ? &*plan.mixed_precision : nullptr,
            res.grad_reduce, plan.pipeline && splits_backward(plan.pipeline->schedule),
            float8 ? &*float8 : nullptr);
    }
}

Placement DataParallel::placement(const Parameter* p) const {
    return fsdp_ && fsdp_->manages(p) ? Placement::shard(0) : Placement::replicate();
}

void DataParallel::broadcast_coalesced(const std::vector<ParamPtr>& tensors, bool poison) {
    std::map<DType, std::vector<ParamPtr>> by_dtype;  // one flat broadcast per dtype, as _broadcast_coalesced
    for (const ParamPtr& p : tensors) by_dtype[p->value.dtype()].push_back(p);
    for (auto& [dtype, list] : by_dtype) {
        int64_t numel = 0;
        for (const ParamPtr& p : list) numel += p->value.numel();
        // on the parameters' device (a host buffer handed to the cuda backend's copy was a bug); every
        // element copied in below
        Tensor flat = Tensor::empty({numel}, dtype, list.front()->value.device());
        int64_t off = 0;
        for (const ParamPtr& p : list) {
            Tensor dst = flat.narrow(0, off, p->value.numel()).reshape(p->value.shape());
            if (poison && dtype_is_float(dtype)) {
                poison_into(p->value, comm_->rank(), dst);  // straight into the copy it makes anyway
            } else {
                if (poison) poison_replica(p->value, comm_->rank());  // counters, in place
                be_.copy(p->value, dst);
            }
            off += p->value.numel();
        }
        comm_->broadcast(flat, 0);
        off = 0;
        for (const ParamPtr& p : list) {
            be_.copy(flat.narrow(0, off, p->value.numel()).reshape(p->value.shape()), p->value);
            off += p->value.numel();
        }
    }
}

void DataParallel::before_forward() {
    if (buffers_.empty()) return;
    CommScope scope(counter_.get(), res_.replicas.size() == 1 ? res_.replicas[0].root : "",
                    CommSiteKind::buffers);
    broadcast_coalesced(buffers_);
}

void DataParallel::after_backward() {
    copy_bytes_ = allreduce_bytes_ = 0;
    if (fsdp_) fsdp_->finish_backward();  // a split backward's accumulated gradients
    if (zero_ && zero_->stage() == 2) return zero_->reduce_scatter_gradients();
    std::map<std::string, int> index;  // of each bucket within its root
    for (Bucket& b : buckets_) {
        const int k = index[b.root]++;
        if (!bucket_view_) {
            int64_t off = 0;
            for (const ParamPtr& p : b.params) {
                Tensor dst = b.flat.narrow(0, off, p->grad.numel()).reshape(p->grad.shape());
                be_.copy(p->grad, dst);
                off += p->grad.numel();
            }
            copy_bytes_ += 2 * static_cast<int64_t>(b.flat.nbytes());
        }
        {
            CommScope scope(counter_.get(), b.root, CommSite::of_bucket(k));
            comm_->all_reduce(b.flat, res_.grad_reduce);
            allreduce_bytes_ += static_cast<int64_t>(b.flat.nbytes());
        }
        if (!bucket_view_) {
            int64_t off = 0;
            for (const ParamPtr& p : b.params) {
                be_.copy(b.flat.narrow(0, off, p->grad.numel()).reshape(p->grad.shape()), p->grad);
                off += p->grad.numel();
            }
        }
    }
}

}  // namespace ptool
