// The plan's names, its queries, and the checks run again after --mesh resizes a dim (plan_load.cpp
// reads the YAML).
#include "parallel/plan.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "core/numbers.h"

namespace ptool {

const char* schedule_kind_name(ScheduleKind k) {
    switch (k) {
        case ScheduleKind::accumulation:
            return "accumulation";
        case ScheduleKind::gpipe:
            return "gpipe";
        case ScheduleKind::one_f_one_b:
            return "1f1b";
        case ScheduleKind::interleaved_one_f_one_b:
            return "interleaved_1f1b";
        case ScheduleKind::zero_bubble:
            return "zero_bubble";
        case ScheduleKind::zbv:
            return "zbv";
        case ScheduleKind::dualpipev:
            return "dualpipev";
    }
    return "?";
}

const char* data_parallel_mode_name(DataParallelMode m) {
    return m == DataParallelMode::replicate ? "replicate" : "fully_shard";
}

std::string DataParallelSpec::mesh_dim_names() const {
    return fmt::format("{}", fmt::join(mesh_dims, " x "));
}

int Plan::dim_size(const std::string& name) const {
    for (const auto& d : mesh())
        if (d.name == name) return d.size;
    return 1;
}

void Plan::resize_mesh(const std::string& name, int size, const std::string& flag) {
    bool found = false;
    for (int d = 0; d < dims.ndim(); ++d)
        if (mesh()[d].name == name) dims.resize(d, size), found = true;
    if (!found) throw InputError(mesh_where, fmt::format("{}: the plan has no mesh dim '{}'", flag, name));
    if (dims.has(DimRole::tp) && src_data_rank && *src_data_rank >= dims.size(DimRole::tp))
        throw InputError(src_data_rank_where,
                         fmt::format("src_data_rank {} is outside the {} ranks of '{}' ({})", *src_data_rank,
                                     dims.size(DimRole::tp), dims.name(DimRole::tp), flag));
    if (pipeline) check_pipeline_counts(*this);
}

int Plan::pipeline_stages() const {
    return pipeline ? dims.size(DimRole::pp) * pipeline->virtual_stages : 1;
}

bool splits_backward(ScheduleKind k) {
    return k == ScheduleKind::zero_bubble || v_placed(k);
}

bool v_placed(ScheduleKind k) {
    return k == ScheduleKind::zbv || k == ScheduleKind::dualpipev;
}

int Plan::microbatches_per_round() const {
    if (!pipeline) return round_microbatches;
    return pipeline->microbatches > 0 ? pipeline->microbatches : pipeline_stages();
}

// The pipeline's counts against its dim's size (again after --mesh resizes it): one split point
// between each two stages; a microbatch per pp rank at least (torch's schedules refuse fewer: the
// last stages would idle while the first drain); interleaved_1f1b's microbatches in groups of the pp
// ranks (Megatron's rule for virtual stages).
void check_pipeline_counts(const Plan& plan) {
    const PipelineSpec& s = *plan.pipeline;
    const int pp = plan.dims.size(DimRole::pp), stages = plan.pipeline_stages();
    const bool interleaved = s.schedule == ScheduleKind::interleaved_one_f_one_b;
    const std::string of = interleaved ? fmt::format("{} pp rank{} x {} virtual stages", pp,
                                                     pp == 1 ? "" : "s", s.virtual_stages)
                                       : fmt::format("{} pp rank{}", pp, pp == 1 ? "" : "s");
    if (!s.split_points.empty() && static_cast<int>(s.split_points.size()) + 1 != stages)
        throw InputError(
            s.split_where,
            fmt::format("{} split point{} make {} stages, but the pipeline has {} ({}): give {} "
                        "split point{}",
                        s.split_points.size(), s.split_points.size() == 1 ? "" : "s",
                        s.split_points.size() + 1, stages, of, stages - 1, stages == 2 ? "" : "s"));
    const int m = plan.microbatches_per_round();
    const SourceLocation& at = s.microbatches > 0 ? s.microbatches_where : s.where;
    if (m < pp)  // torch's schedules refuse fewer microbatches than pp ranks (torchtitan#775: a hang)
        throw InputError(at,
                         fmt::format("{} microbatches < {} stages ({}): {} needs a microbatch per pp rank at "
                                     "least",
                                     m, stages, of, schedule_kind_name(s.schedule)));
    if (interleaved && m % pp != 0)
        throw InputError(at,
                         fmt::format("interleaved_1f1b runs microbatches in rounds of the {} pp ranks: {} "
                                     "microbatches is no multiple of {}",
                                     pp, m, pp));
    if (!splits_backward(s.schedule)) return;
    if (s.schedule == ScheduleKind::dualpipev && m < 2 * pp)  // torch's ScheduleDualPipeV
        throw InputError(at, fmt::format("dualpipev needs at least as many microbatches as stages: {} "
                                         "microbatches for {} stages on {} pp ranks (torch's rule)",
                                         m, 2 * pp, pp));
    if (const int rounds = std::max(1, m / pp);
        s.schedule == ScheduleKind::zero_bubble && m % rounds != 0)  // torch's ScheduleInterleavedZeroBubble
        throw InputError(at, fmt::format("zero_bubble: {} microbatches must be a multiple of its rounds, "
                                         "max(1, microbatches / {} pp ranks) = {} (torch's rule)",
                                         m, pp, rounds));
}

void check_microbatches(const Plan& plan, const Model& model) {
    const int64_t rows = model.input.shape.empty() ? 1 : model.input.shape[0],
                  rounds = plan.accumulation_rounds(model), data = plan.dims.data_size();
    const bool planned = plan.gradient_accumulation > 0;  // else the model's: its loader cut the rows
    if (planned && rows % rounds != 0)
        throw InputError(
            plan.gradient_accumulation_where,
            fmt::format("gradient_accumulation {} does not divide the batch's {} rows into equal "
                        "microbatches",
                        rounds, rows));
    if (plan.pipeline) {  // the step's microbatches: gradient_accumulation rounds of the pipeline's
        const PipelineSpec& pp = *plan.pipeline;
        const int64_t m = plan.microbatches_per_round(), microbatches = rounds * m;
        // the plan's rounds are blamed where the pipeline's microbatches alone would fit
        const bool fit_alone = rows % m == 0 && (rows / m) % data == 0;
        const SourceLocation& at = planned && fit_alone  ? plan.gradient_accumulation_where
                                   : pp.microbatches > 0 ? pp.microbatches_where
                                                         : pp.where;
        const std::string count =
            rounds > 1 ? fmt::format("{} microbatches ({} rounds of gradient_accumulation x {})",
                                     microbatches, rounds, m)
                       : fmt::format("{} microbatches", microbatches);
        if (rows % microbatches != 0)
            throw InputError(
                at, fmt::format("the batch's {} rows do not cut into {} of equal rows", rows, count));
        if ((rows / microbatches) % data != 0)
            throw InputError(at,
                             fmt::format("each of the {} of {} rows does not split evenly over the {} data "
                                         "ranks",
                                         count, rows / microbatches, data));
    } else if (planned && rows % data == 0 && rows % (data * rounds) != 0) {
        // (the batch itself not splitting over the data ranks is data_parallel's to say)
        throw InputError(
            plan.gradient_accumulation_where,
            fmt::format("each of the {} microbatches of {} row{} (the plan's gradient_accumulation) "
                        "does not split evenly over the {} data ranks",
                        rounds, rows / rounds, rows / rounds == 1 ? "" : "s", data));
    }
}

bool Plan::compares(const std::string& what) const {
    return std::find(verify.compare.begin(), verify.compare.end(), what) != verify.compare.end();
}

void apply_mesh_flags(Plan& plan, const std::vector<std::string>& flags) {
    std::set<std::string> seen;
    for (const std::string& m : flags) {
        // NAME=SIZE, the whole text: "tp=1e3", "tp=2abc", "dp=1:tp=4" and "tp=2,dp=8" are not a size
        const size_t eq = m.find('=');
        const std::string name = eq == std::string::npos ? m : m.substr(0, eq);
        const int64_t size = eq == std::string::npos ? 0 : parse_whole_int(m.substr(eq + 1)).value_or(0);
        const bool word = !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
            return std::isalnum(c) || c == '_';
        });
        if (!word || size < 1 || size > 4096)
            throw InputError(fmt::format(
                "--mesh '{}': expected NAME=SIZE with SIZE a whole number in [1, 4096], e.g. tp=8 "
                "(one dim per --mesh: --mesh dp=2 --mesh tp=4)",
                m));
        if (!seen.insert(name).second)
            throw InputError(fmt::format("--mesh '{}': '{}' is resized twice", m, name));
        plan.resize_mesh(name, static_cast<int>(size), "--mesh " + m);
    }
}

}  // namespace ptool
