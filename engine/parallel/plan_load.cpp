// The plan's YAML read once into a Plan: the mesh, then each section, which claims its mesh dims
// (RoleClaims: a dim of the mesh, one role per dim) and reads its own keys. The Plan's queries and
// the checks run again after --mesh are in plan.cpp.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/yaml_reader.h"
#include "parallel/plan.h"

namespace ptool {
namespace {

// `pattern: style` or `pattern: {style: ..., options}`; each style reads its own options.
StyleSpec parse_style(const YamlNode& node, const std::string& pattern) {
    const std::string what = fmt::format("the style of '{}'", pattern);
    std::optional<YamlMap> m;
    if (node.is_map()) m.emplace(node, what);
    const YamlNode style_node = m ? m->at("style") : node;
    const std::string name = style_node.as_string("a style");
    StyleSpec s;
    s.style = find_style(name);
    if (!s.style)
        style_node.fail(fmt::format("unknown style '{}'{}", name, did_you_mean(name, style_names())));
    YamlMap options =
        m ? std::move(*m)
          : YamlMap(YamlNode(YAML::Node(YAML::NodeType::Map), std::make_shared<std::string>(node.file())),
                    what);
    s.style->parse(options, node, s);
    options.finish();
    return s;
}

std::vector<std::string> string_list(const YamlNode& node, const char* what) {
    std::vector<std::string> out;
    for (const YamlNode& item : node.items(fmt::format("'{}'", what)))
        out.push_back(item.as_string(fmt::format("an entry of '{}'", what)));
    return out;
}

MixedPrecisionSpec parse_mixed_precision(const YamlNode& node) {
    YamlMap mm(node, "'mixed_precision'");
    MixedPrecisionSpec p;
    p.where = node.where();
    auto dtype_of = [&](const char* key) {
        YamlNode v = mm.at(key);
        DType dt = DType::float32;
        try {
            dt = parse_dtype(v.as_string(fmt::format("'{}'", key)));
        } catch (const InputError& e) {
            v.fail(e.message());
        }
        if (!dtype_is_float(dt))
            v.fail(fmt::format("'{}' must be a floating dtype, got {}", key, dtype_name(dt)));
        return dt;
    };
    p.param_dtype = dtype_of("param_dtype");
    p.reduce_dtype = mm.has("reduce_dtype") ? dtype_of("reduce_dtype") : p.param_dtype;
    p.cast_forward_inputs = mm.bool_or("cast_forward_inputs", true);
    mm.finish();
    return p;
}

// The roles the plan's sections give the mesh's dims, checked in one place as each section claims
// its dims: a dim of the mesh, one role per dim.
class RoleClaims {
public:
    explicit RoleClaims(const std::vector<MeshDim>& mesh) : mesh_(mesh), roles_(mesh.size()) {}
    std::vector<std::string> names() const {  // in the mesh's order, as messages list them
        std::vector<std::string> out;
        for (const MeshDim& d : mesh_) out.push_back(d.name);
        return out;
    }
    // `section`'s mesh_dim: the node naming it (or the section, for a 1-D mesh's implicit dim)
    void claim(const std::string& dim, DimRole role, const YamlNode& where, const char* section) {
        const int d = index(dim);
        if (d < 0) {
            const std::vector<std::string> all = names();
            where.fail(fmt::format("mesh_dim '{}' is not a dim of the mesh{}", dim,
                                   did_you_mean(dim, std::vector<std::string>(all.begin(), all.end()))));
        }
        if (roles_[d]) {
            const bool data = is_data_role(role) && is_data_role(*roles_[d]);
            where.fail(data ? fmt::format("mesh dim '{}' is named twice in data_parallel's mesh_dim", dim)
                            : fmt::format("{} and {} both use mesh dim '{}': give each its own dim, e.g. "
                                          "mesh: {{{}: 2, {}: 2}}",
                                          section, sections_[d], dim, example(section),
                                          example(sections_[d])));
        }
        roles_[d] = role;
        sections_[d] = section;
    }
    // A section's mesh_dim key claimed for `role`, or on a 1-D mesh without the key its one dim (as
    // PyTorch's 1-D DeviceMesh); a mesh of more dims needs the key.
    void claim_section_dim(YamlMap& section_map, const YamlNode& node, DimRole role, const char* section) {
        const std::vector<std::string> all = names();
        if (auto dim = section_map.get("mesh_dim"))
            claim(dim->as_string("'mesh_dim'"), role, *dim, section);
        else if (all.size() == 1)
            claim(*all.begin(), role, node, section);
        else
            node.fail(fmt::format("'{}' needs 'mesh_dim': the mesh has {} dims ({})", section, all.size(),
                                  fmt::join(all, ", ")));
    }
    // The role of a dim already claimed (data_parallel's, once its mode is read)
    void set_role(const std::string& dim, DimRole role) { roles_[index(dim)] = role; }
    ParallelDims dims() const { return ParallelDims(mesh_, roles_); }

private:
    static const char* example(const std::string& section) {  // a dim name for the section's role
        return section == "tensor_parallel"     ? "tp"
               : section == "pipeline_parallel" ? "pp"
               : section == "context_parallel"  ? "cp"
                                                : "dp";
    }
    int index(const std::string& name) const {
        for (size_t d = 0; d < mesh_.size(); ++d)
            if (mesh_[d].name == name) return static_cast<int>(d);
        return -1;
    }
    std::vector<MeshDim> mesh_;
    std::vector<std::optional<DimRole>> roles_;
    std::vector<std::string> sections_ = std::vector<std::string>(mesh_.size());
};

// data_parallel's mesh_dim: one dim, or [replicate, shard] for HSDP (mode fully_shard), each with
// the node that names it.
std::vector<std::pair<std::string, YamlNode>> data_parallel_dims(const YamlNode& node,
                                                                 const std::optional<YamlNode>& dim,
                                                                 const RoleClaims& claims) {
    const std::vector<std::string> names = claims.names();
    if (!dim && names.size() == 1)
        return {{*names.begin(), node}};  // a 1-D mesh: its one dim, as PyTorch's 1-D DeviceMesh
    if (!dim)
        node.fail(fmt::format("'data_parallel' needs 'mesh_dim': the mesh has {} dims ({})", names.size(),
                              fmt::join(names, ", ")));
    if (!dim->is_seq()) return {{dim->as_string("'mesh_dim'"), *dim}};
    std::vector<std::pair<std::string, YamlNode>> out;
    for (const YamlNode& item : dim->items("'mesh_dim'"))
        out.push_back({item.as_string("an entry of 'mesh_dim'"), item});
    if (out.size() != 2)
        dim->fail(
            fmt::format("'mesh_dim' lists {} dims: data_parallel takes one dim, or two for HSDP "
                        "([replicate, shard], mode fully_shard)",
                        out.size()));
    return out;
}

// data_parallel (and its mixed_precision, which the reference shares: it is numerics, not layout)
// zero_stage: 0, 1 or 2 under mode replicate, over DDP's buckets (parallel/zero_optimizer.h); what
// ptool does not build with it is refused here, at the key.
void parse_zero_stage(const YamlNode& v, DataParallelSpec& s) {
    const int64_t stage = v.as_int("'zero_stage'");
    if (stage < 0 || stage > 2)
        v.fail(fmt::format("zero_stage {} must be 0 (DDP), 1 (optimizer state sharded) or 2 (gradients too)",
                           stage));
    s.zero_stage = static_cast<int>(stage);
    s.zero_stage_where = v.where();
    if (stage == 0) return;
    if (s.mode != DataParallelMode::replicate)
        v.fail(
            fmt::format("zero_stage {} shards DDP's optimizer state over the dp ranks: it needs mode "
                        "replicate (fully_shard already shards parameters, gradients and optimizer state)",
                        stage));
    if (!s.fully_shard.empty())
        v.fail(
            fmt::format("zero_stage {} with fully_shard units: ptool shards only replicate()'s buckets; "
                        "drop one of them",
                        stage));
    if (stage == 2 && s.gradient_as_bucket_view)
        v.fail(
            "zero_stage 2 frees the full gradients after their reduce_scatter, and "
            "gradient_as_bucket_view keeps them as views of the buckets: drop one of them");
}

DataParallelSpec parse_data_parallel(const YamlNode& node, RoleClaims& claims,
                                     std::optional<MixedPrecisionSpec>& mixed_precision) {
    YamlMap d(node, "'data_parallel'");
    DataParallelSpec s;
    s.where = node.where();
    const std::optional<YamlNode> dim = d.get("mesh_dim");
    const auto dims = data_parallel_dims(node, dim, claims);
    for (const auto& [name, where] : dims) {
        claims.claim(name, DimRole::dp_replicate, where, "data_parallel");  // its role once the mode is known
        s.mesh_dims.push_back(name);
    }
    if (auto mode = d.get("mode")) {
        const std::string m = mode->as_string("'mode'");
        const std::vector<std::string> modes = {"replicate", "fully_shard"};
        if (std::find(modes.begin(), modes.end(), m) == modes.end())
            mode->fail(
                fmt::format("unknown mode '{}'{}", m, did_you_mean(m, modes)));  // names the valid ones once
        s.mode = m == "replicate" ? DataParallelMode::replicate : DataParallelMode::fully_shard;
        if (s.hybrid() && s.mode == DataParallelMode::replicate)
            mode->fail(
                "mode replicate takes one mesh dim: two dims ([replicate, shard]) are HSDP, mode "
                "fully_shard");
    } else if (s.hybrid()) {
        dim->fail("two mesh dims ([replicate, shard]) are HSDP: it needs mode: fully_shard");
    }
    // HSDP: replicated over the first dim, sharded over the second; else the mode's role
    if (s.hybrid())
        claims.set_role(s.mesh_dims[1], DimRole::dp_shard);
    else if (s.mode == DataParallelMode::fully_shard)
        claims.set_role(s.mesh_dims[0], DimRole::dp_shard);
    if (auto v = d.get("modules")) {
        s.modules = string_list(*v, "modules");
        s.modules_where = v->where();
        if (s.modules.empty())
            v->fail("'modules' is empty: name the modules to replicate, or leave it out for the root");
        if (s.mode == DataParallelMode::fully_shard)
            v->fail("'modules' names replicate() roots; in mode fully_shard list units under 'fully_shard'");
    }
    if (auto v = d.get("fully_shard")) {
        s.fully_shard = string_list(*v, "fully_shard");
        s.fully_shard_where = v->where();
    }
    if (auto v = d.get("bucket_cap_mb")) {
        s.bucket_cap_mb = v->as_double("'bucket_cap_mb'");
        if (!(s.bucket_cap_mb > 0) || s.bucket_cap_mb > 1e6)
            v->fail(fmt::format("bucket_cap_mb {} must be in (0, 1e6]", s.bucket_cap_mb));
    }
    s.gradient_as_bucket_view = d.bool_or("gradient_as_bucket_view", false);
    if (auto v = d.get("ignored_modules")) {
        s.ignored_modules = string_list(*v, "ignored_modules");
        s.ignored_where = v->where();
    }
    s.broadcast_buffers = d.bool_or("broadcast_buffers", true);
    s.sync_batch_norm = d.bool_or("sync_batch_norm", false);
    if (auto v = d.get("zero_stage")) parse_zero_stage(*v, s);
    if (auto mp = d.get("mixed_precision")) mixed_precision = parse_mixed_precision(*mp);
    d.finish();
    return s;
}

std::vector<MeshDim> parse_mesh(const YamlNode& mesh, Plan& plan) {
    plan.mesh_where = mesh.where();
    if (!mesh.is_map()) mesh.fail("'mesh' must be a map of named dims, e.g. {tp: 4}");
    std::set<std::string> names;
    std::vector<MeshDim> dims;
    int64_t world = 1;
    for (const auto& kv : mesh.raw()) {
        YamlNode key(kv.first, std::make_shared<std::string>(mesh.file())),
            value(kv.second, std::make_shared<std::string>(mesh.file()));
        const std::string name = key.as_string("a mesh dim name");
        if (name.empty()) key.fail("a mesh dim needs a name, e.g. {tp: 4} (sections name their dims)");
        if (!names.insert(name).second) key.fail(fmt::format("duplicate key '{}' in the mesh", name));
        const int64_t size = value.as_positive_int(fmt::format("mesh dim '{}'", name));
        if (size > 4096)
            value.fail(fmt::format("mesh dim '{}' of {} ranks is over the limit of 4096", name, size));
        dims.push_back({name, static_cast<int>(size)});
        world = std::min<int64_t>(world * size, int64_t{1} << 40);
    }
    if (dims.empty()) mesh.fail("'mesh' has no dims");
    if (world > 4096) mesh.fail(fmt::format("the mesh has {} ranks, over the limit of 4096", world));
    return dims;
}

void parse_tensor_parallel(const YamlNode& node, Plan& plan, RoleClaims& claims) {
    YamlMap t(node, "'tensor_parallel'");
    claims.claim_section_dim(t, node, DimRole::tp, "tensor_parallel");
    plan.dims = claims.dims();  // src_data_rank is checked against the tp dim's size
    if (auto src = t.get("src_data_rank")) {
        plan.src_data_rank_where = src->where();
        if (src->is_null()) {
            plan.src_data_rank = std::nullopt;
        } else {
            const int64_t r = src->as_int("'src_data_rank'");
            const int tp = plan.dims.size(DimRole::tp);
            if (r < 0 || r >= tp)
                src->fail(fmt::format("src_data_rank {} is outside the {} ranks of '{}'", r, tp,
                                      plan.dims.name(DimRole::tp)));
            plan.src_data_rank = static_cast<int>(r);
        }
    }
    if (auto lp = t.get("loss_parallel")) {
        plan.loss_parallel = lp->as_bool("'loss_parallel'");
        plan.loss_parallel_where = lp->where();
    }
    YamlNode entries = t.at("plan");
    plan.tp_plan_where = entries.where();
    if (!entries.is_map() && !entries.is_null()) entries.fail("'plan' must be a map of FQN pattern: style");
    std::set<std::string> patterns;
    if (entries.is_map())
        for (const auto& kv : entries.raw()) {
            YamlNode key(kv.first, std::make_shared<std::string>(node.file()));
            const std::string pattern = key.as_string("a pattern");
            if (!patterns.insert(pattern).second)
                key.fail(fmt::format("duplicate key '{}' in the plan", pattern));
            plan.tp_plan.push_back(
                {pattern,
                 parse_style(YamlNode(kv.second, std::make_shared<std::string>(node.file())), pattern),
                 key.where()});
        }
    t.finish();
}

// pipeline_parallel: its dim (implicit on a 1-D mesh), the stages, the schedule, the microbatches
void parse_pipeline(const YamlNode& node, Plan& plan, RoleClaims& claims) {
    YamlMap pm(node, "'pipeline_parallel'");
    PipelineSpec s;
    s.where = node.where();
    claims.claim_section_dim(pm, node, DimRole::pp, "pipeline_parallel");
    const ParallelDims dims = claims.dims();
    if (auto v = pm.get("schedule")) {
        // ptool's names, and torch's / torchtitan's spellings of the same schedules
        static const std::vector<std::pair<std::string, ScheduleKind>> kinds = {
            {"gpipe", ScheduleKind::gpipe},
            {"1f1b", ScheduleKind::one_f_one_b},
            {"interleaved_1f1b", ScheduleKind::interleaved_one_f_one_b},
            {"GPipe", ScheduleKind::gpipe},
            {"1F1B", ScheduleKind::one_f_one_b},
            {"Interleaved1F1B", ScheduleKind::interleaved_one_f_one_b},
            {"zero_bubble", ScheduleKind::zero_bubble},
            {"InterleavedZeroBubble", ScheduleKind::zero_bubble},
            {"zbv", ScheduleKind::zbv},
            {"ZBVZeroBubble", ScheduleKind::zbv},
            {"dualpipev", ScheduleKind::dualpipev},
            {"DualPipeV", ScheduleKind::dualpipev}};
        const std::string name = v->as_string("'schedule'");
        auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == name; });
        if (it == kinds.end())
            v->fail(fmt::format(
                "unknown schedule '{}'{} (gpipe, 1f1b, interleaved_1f1b, zero_bubble, zbv or dualpipev)",
                name,
                did_you_mean(name,
                             {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "dualpipev"})));
        s.schedule = it->second;
        s.schedule_where = v->where();
    }
    const bool interleaved = s.schedule == ScheduleKind::interleaved_one_f_one_b;
    const bool zero_bubble = s.schedule == ScheduleKind::zero_bubble;  // one stage per rank by default
    if (interleaved || v_placed(s.schedule)) s.virtual_stages = 2;
    if (auto v = pm.get("virtual_stages")) {
        const int64_t n = v->as_positive_int("'virtual_stages'");
        if (v_placed(s.schedule) && n != 2)
            v->fail(
                fmt::format("virtual_stages {}: {} holds exactly 2 stages per rank, in a V (torch's rule)", n,
                            schedule_kind_name(s.schedule)));
        if (!interleaved && !zero_bubble && !v_placed(s.schedule))
            v->fail(
                fmt::format("virtual_stages {} needs schedule interleaved_1f1b or zero_bubble: {} runs one "
                            "stage per rank",
                            n, schedule_kind_name(s.schedule)));
        if (zero_bubble && n > 64)
            v->fail(fmt::format("virtual_stages {} is over the limit of 64", n));
        else if (!zero_bubble && (n < 2 || n > 64))
            v->fail(
                fmt::format("virtual_stages {} must be in [2, 64]: interleaved_1f1b holds two stages per "
                            "rank or more (one is 1f1b)",
                            n));
        s.virtual_stages = static_cast<int>(n);
    }
    const std::optional<YamlNode> split = pm.get("split_points"), per = pm.get("layers_per_stage");
    if (split && per) per->fail("'layers_per_stage' and 'split_points' both cut the stages: give one");
    if (split) {
        s.split_points = string_list(*split, "split_points");
        s.split_where = split->where();
        if (s.split_points.empty())  // (as verify's compare: [], an empty list says nothing)
            split->fail(
                "'split_points' is empty: name the modules that start stages 1.., or leave it out "
                "to cut the blocks evenly");
        std::set<std::string> seen;
        for (const std::string& p : s.split_points)
            if (!seen.insert(p).second) split->fail(fmt::format("split point '{}' is named twice", p));
    }
    if (per) {
        const int64_t n = per->as_positive_int("'layers_per_stage'");
        if (n > 1 << 20) per->fail(fmt::format("layers_per_stage {} is over the limit of {}", n, 1 << 20));
        s.layers_per_stage = static_cast<int>(n);
        s.split_where = per->where();
    }
    if (auto v = pm.get("microbatches")) {
        const int64_t m = v->as_positive_int("'microbatches'");
        s.microbatches_where = v->where();
        if (m > 4096) v->fail(fmt::format("microbatches {} is over the limit of 4096", m));
        s.microbatches = static_cast<int>(m);
    }
    if (auto v = pm.get("scatter_gather")) {
        s.scatter_gather = v->as_bool("'scatter_gather'");
        s.scatter_gather_where = v->where();
    }
    // one meaning of gradient_accumulation: the step's rounds of the schedule, the plan's top-level
    // key (as the model's); a second count of rounds here would be another
    if (auto v = pm.get("gradient_accumulation"))
        v->fail(
            "gradient_accumulation is a top-level key of the plan, not of pipeline_parallel: the step's "
            "rounds of this schedule, each of its microbatches (write it beside pipeline_parallel)");
    pm.finish();
    plan.pipeline = std::move(s);
    plan.dims = dims;
    check_pipeline_counts(plan);
}

double tolerance_value(YamlMap& m, const char* key) {
    YamlNode v = m.at(key);
    const double x = v.as_double(fmt::format("'{}'", key));
    if (!std::isfinite(x) || x < 0) v.fail(fmt::format("'{}: {}' must be a finite number >= 0", key, x));
    return x;
}

void parse_verify(const YamlNode& node, Plan& plan) {
    YamlMap vm(node, "'verify'");
    if (vm.has("steps")) {
        plan.verify.steps = vm.at("steps").as_positive_int("'steps'");
        if (plan.verify.steps > kMaxSteps)
            vm.at("steps").fail(
                fmt::format("steps {} is over the limit of {}", plan.verify.steps, kMaxSteps));
    }
    if (auto c = vm.get("compare")) {
        plan.verify.compare.clear();
        for (const YamlNode& item : c->items("'compare'")) {
            const std::string w = item.as_string("a compare entry");
            const std::vector<std::string> valid = {"output", "loss", "grad", "param"};
            if (std::find(valid.begin(), valid.end(), w) == valid.end())
                item.fail(fmt::format("unknown compare entry '{}'{}", w, did_you_mean(w, valid)));
            plan.verify.compare.push_back(w);
        }
        if (plan.verify.compare.empty())
            c->fail("'compare' is empty: a verify that compares nothing would pass anything");
    }
    if (auto tol = vm.get("tolerance")) {
        YamlMap tm(*tol, "'tolerance'");
        if (tm.has("rtol")) plan.verify.tolerance.rtol = tolerance_value(tm, "rtol");
        if (tm.has("atol")) plan.verify.tolerance.atol = tolerance_value(tm, "atol");
        tm.finish();
    }
    vm.finish();
}

// context_parallel: its dim (implicit on a 1-D mesh), the rotation, load balancing
void parse_context_parallel(const YamlNode& node, Plan& plan, RoleClaims& claims) {
    YamlMap cm(node, "'context_parallel'");
    ContextParallelSpec s;
    s.where = node.where();
    claims.claim_section_dim(cm, node, DimRole::cp, "context_parallel");
    if (auto r = cm.get("rotate_method")) {
        const std::string v = r->as_string("'rotate_method'");
        s.rotate_where = r->where();
        if (v != "allgather" && v != "alltoall")
            r->fail(fmt::format("rotate_method '{}'{}", v, did_you_mean(v, {"allgather", "alltoall"})));
        s.rotate = v == "alltoall" ? RotateMethod::alltoall : RotateMethod::allgather;
    }
    s.load_balance = cm.bool_or("load_balance", true);
    cm.finish();
    plan.context_parallel = s;
}

// expert_parallel: the data dim the experts split over (implicit when data_parallel has one), after
// data_parallel's claims
void parse_expert_parallel(const YamlNode& node, Plan& plan) {
    YamlMap em(node, "'expert_parallel'");
    if (!plan.data_parallel)
        node.fail(
            "expert_parallel borrows a data-parallel dim (torchtitan's ep): the plan needs a "
            "data_parallel section, whose gradient sync the non-expert parameters need over it");
    const std::vector<std::string>& data = plan.data_parallel->mesh_dims;
    std::string dim;
    std::optional<YamlNode> at = em.get("mesh_dim");
    if (at)
        dim = at->as_string("'mesh_dim'");
    else if (data.size() == 1)
        dim = data.front();
    else
        node.fail(fmt::format("'expert_parallel' needs 'mesh_dim': one of data_parallel's dims ({})",
                              fmt::join(data, ", ")));
    if (std::find(data.begin(), data.end(), dim) == data.end())
        (at ? *at : node)
            .fail(
                fmt::format("expert_parallel's mesh_dim '{}' is not a data-parallel dim: experts split over "
                            "ranks that hold different tokens (data_parallel's {}){}",
                            dim, fmt::join(data, ", "), did_you_mean(dim, data)));
    if (plan.data_parallel->zero_stage > 0)
        throw InputError(plan.data_parallel->zero_stage_where,
                         "zero_stage with expert_parallel: ptool does not shard an optimizer over expert "
                         "and non-expert parameters yet (use zero_stage 0, or fully_shard)");
    em.finish();
    ExpertParallelSpec s;
    s.where = node.where();
    plan.expert_parallel = s;
    for (int d = 0; d < plan.dims.ndim(); ++d)
        if (plan.mesh()[d].name == dim) plan.dims.set_expert_dim(d);
}

// The plan of a parsed document (`text` its source).
Plan plan_of_document(const YamlNode& root, const std::string& text, const std::string& path) {
    YamlMap m(root, "the plan");
    Plan plan;
    plan.path = path;
    plan.yaml_text = text;
    plan.name = std::filesystem::path(path).stem().string();
    RoleClaims claims(parse_mesh(m.at("mesh"), plan));
    if (auto tp = m.get("tensor_parallel")) parse_tensor_parallel(*tp, plan, claims);
    if (auto dp = m.get("data_parallel"))
        plan.data_parallel = parse_data_parallel(*dp, claims, plan.mixed_precision);
    if (auto pp = m.get("pipeline_parallel")) parse_pipeline(*pp, plan, claims);
    if (auto cp = m.get("context_parallel")) parse_context_parallel(*cp, plan, claims);
    if (plan.pipeline && plan.data_parallel && plan.data_parallel->zero_stage > 0)
        throw InputError(plan.data_parallel->zero_stage_where,
                         "zero_stage with pipeline_parallel: ptool does not build ZeRO over a pipeline's "
                         "stages yet (use zero_stage 0, or fully_shard)");
    plan.dims = claims.dims();
    // fully_shard under context parallel shards over dp_shard x cp (torchtitan's dp_shard_cp)
    plan.dims.set_cp_shards_params(plan.data_parallel &&
                                   (plan.data_parallel->mode == DataParallelMode::fully_shard ||
                                    !plan.data_parallel->fully_shard.empty()));
    if (auto ep = m.get("expert_parallel")) parse_expert_parallel(*ep, plan);
    if (auto ac = m.get("activation_checkpointing"))
        plan.activation_checkpointing = parse_activation_checkpointing(*ac);
    if (auto g = m.get("gradient_accumulation")) {
        plan.gradient_accumulation = g->as_positive_int("'gradient_accumulation'");
        plan.gradient_accumulation_where = g->where();
        if (plan.gradient_accumulation > kMaxGradientAccumulation)
            g->fail(fmt::format("gradient_accumulation {} is over the limit of {}",
                                plan.gradient_accumulation, kMaxGradientAccumulation));
    }
    if (auto n = m.get("loss_normalization")) {
        plan.loss_normalization = parse_loss_normalization(n->as_string("'loss_normalization'"), n->where());
        plan.loss_normalization_where = n->where();
    }
    if (auto f = m.get("float8")) plan.float8 = parse_float8(*f);
    if (auto c = m.get("compile")) plan.compile = c->as_bool("'compile'");
    if (auto v = m.get("verify")) parse_verify(*v, plan);
    m.finish();
    return plan;
}

}  // namespace

Plan load_plan_text(const std::string& text, const std::string& path) {
    return plan_of_document(load_yaml_text(text, path), text, path);
}

Plan load_emitted_plan(const std::string& text, const std::string& path) {
    return plan_of_document(load_emitted_yaml(text, path), text, path);
}

Plan load_plan(const std::string& path) {
    return load_plan_text(read_file(path, YamlLimits{}.max_bytes), path);
}
}  // namespace ptool
