#include "plan/shrink.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "core/yaml_reader.h"
#include "core/yaml_writer.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// What the entry's type says shrink changes in it (model/module_type.h); nothing for an unknown
// type (the loader refused it already).
ShrinkKeys keys_of(const YAML::Node& m) {
    const ModuleType* t = m["type"] && m["type"].IsScalar() ? find_module_type(m["type"].Scalar()) : nullptr;
    return t ? t->shrink_keys() : ShrinkKeys{};
}

void for_each_module(YAML::Node mods, const std::function<void(YAML::Node)>& fn) {
    if (!mods || !mods.IsSequence()) return;
    for (YAML::Node m : mods) {
        fn(m);
        for_each_module(m["modules"], fn);
    }
}

// A size as the model loader reads it (`010` is ten, where yaml-cpp's conversion reads octal eight).
// The loader accepted the text already, so the reading never fails and names no file.
int64_t as_int(const YAML::Node& n) {
    static const auto accepted = std::make_shared<const std::string>("the model");
    return YamlNode(n, accepted).as_int("a size");
}

}  // namespace

ModelVariants::ModelVariants(const std::string& text, const std::string& name)
    // the loader accepted the text already; its marks are the file's lines
    : doc_(yaml_unaliased(YAML::Load(text)), std::make_shared<const std::string>(name)) {
    // every scalar a variant may set, with its text as written (read by the loader, as the file's)
    YAML::Node doc = doc_.raw();
    const auto file = std::make_shared<const std::string>(name);
    for_each_module(doc["modules"], [&](YAML::Node m) {
        const ShrinkKeys k = keys_of(m);
        if (k.count.empty() || !m[k.count] || !m[k.count].IsScalar()) return;
        const int64_t blocks = YamlNode(m[k.count], file).as_int("a repeat's count");
        counts_.push_back({m[k.count], m[k.count].Scalar(), blocks >= 4});
    });
    YAML::Node batch = doc["batch"];
    YAML::Node input = batch["input"];
    for (YAML::Node shape : {input.IsMap() ? input["tokens"] : input, batch["target"]})
        if (shape && shape.IsSequence() && shape.size() > 0 && shape[0].IsScalar())
            rows_.push_back({shape[0], shape[0].Scalar()});
}

const YamlNode& ModelVariants::at(int64_t count, int64_t microbatches, int64_t rows) {
    // the file's text back in every node first (YAML::Node's assignment writes into the document's
    // own node, which an alias shares), then this variant's edits in the order a fresh document
    // took them: each repeat of 4 or more blocks, the microbatches, the rows
    for (Count& c : counts_) c.node = c.text;
    for (auto& [node, text] : rows_) node = text;
    if (count > 0)
        for (Count& c : counts_)
            if (c.long_repeat) c.node = count;
    YAML::Node doc = doc_.raw();
    doc["gradient_accumulation"] = microbatches;
    if (rows > 0)
        for (auto& [node, text] : rows_) node = rows;
    return doc_;
}

// A proxy's masked targets: the prompt and padding lengths scaled with the sequence (old_seq ->
// seq) and clamped to leave each row a valid target, the fraction at most 1/2: the proxy masks as
// the model does, and its far fewer targets are never all masked where the model's are not.
static void shrink_target_mask(YAML::Node mask, int64_t old_seq, int64_t seq) {
    int64_t room = seq - 1;  // the positions prompt and padding may take together
    for (const char* key : {"padding", "prompt"}) {
        YAML::Node range = mask[key];
        if (!range) continue;
        auto scaled = [&](const YAML::Node& v) {
            return std::min(room, as_int(v) * seq / std::max<int64_t>(old_seq, 1));
        };
        const int64_t lo = scaled(range.IsSequence() ? range[0] : range),
                      hi = scaled(range.IsSequence() ? range[1] : range);
        YAML::Node out(YAML::NodeType::Sequence);
        out.SetStyle(YAML::EmitterStyle::Flow);
        out.push_back(lo);
        out.push_back(hi);
        mask[key] = out;
        room -= hi;
    }
    if (mask["fraction"] && mask["fraction"].as<double>() > 0.5) mask["fraction"] = 0.5;
}

std::string shrink_model(const std::string& model_text, const std::string& name, const Plan& plan) {
    YAML::Node doc = yaml_unaliased(YAML::Load(model_text));  // each place edited apart
    const int64_t tp = plan.dims.size(DimRole::tp);
    const int64_t dp = plan.dims.data_size();  // the batch's rows split over every data rank
    // context parallel cuts the sequence into cp chunks (2 x cp load-balanced), each split again by tp
    const int64_t cp_pieces =
        plan.context_parallel
            ? ContextShard::pieces(plan.dims.size(DimRole::cp), plan.context_parallel->load_balance)
            : 1;
    // the step's rounds: the plan's gradient_accumulation over the model's (the proxy then carries the
    // plan's, so that it loads with its rows and means what the plan does)
    const int64_t mb = plan.gradient_accumulation > 0 ? plan.gradient_accumulation
                       : doc["gradient_accumulation"] ? as_int(doc["gradient_accumulation"])
                                                      : 1;
    if (plan.gradient_accumulation > 0) doc["gradient_accumulation"] = plan.gradient_accumulation;
    // fully_shard over dp x cp (torchtitan's dp_shard_cp) chunks each parameter's rows on a tp rank
    // over dp_shard x cp flattened: every size a multiple of tp x that keeps the proxy's shards even
    int64_t cp_shards = 1;
    if (plan.context_parallel && plan.dims.cp_shards_params()) {
        const ParallelDims& dims = plan.dims;
        const int shard_dim =
            dims.has(DimRole::dp_shard) ? dims.index(DimRole::dp_shard) : dims.index(DimRole::dp_replicate);
        cp_shards = static_cast<int64_t>(dims.mesh()[shard_dim].size) * dims.size(DimRole::cp);
    }
    // (16 under float8: a linear takes float8 where its features are multiples of 16, so the proxy
    // converts the linears the model does)
    const int64_t unit = std::lcm<int64_t>(tp * cp_shards, plan.float8 ? 16 : 8);

    // attention dims first: they must be a multiple of the new head count
    std::map<int64_t, int64_t> dim_heads;  // old dim -> lcm of its attentions' new head counts
    for_each_module(doc["modules"], [&](YAML::Node m) {
        const ShrinkKeys k = keys_of(m);
        if (k.heads.empty()) return;
        const int64_t heads = as_int(m[k.heads]), kv = m[k.kv_heads] ? as_int(m[k.kv_heads]) : heads;
        const int64_t kv2 = kv % tp == 0 ? tp : kv, heads2 = kv2 * (heads / kv);
        m[k.heads] = heads2;
        if (m[k.kv_heads]) m[k.kv_heads] = kv2;
        const int64_t d = as_int(m[k.heads_of]);
        dim_heads[d] = std::lcm(dim_heads.count(d) ? dim_heads[d] : 1, heads2);
    });
    std::set<int64_t> values;  // every size, the attention dims too: their order is kept
    for (const auto& [d, h] : dim_heads) values.insert(d);
    for_each_module(doc["modules"], [&](YAML::Node m) {
        for (const std::string& key : keys_of(m).sizes)
            if (m[key] && m[key].IsScalar()) values.insert(as_int(m[key]));
    });
    YAML::Node batch = doc["batch"];
    YAML::Node input = batch["input"];
    const bool tokens = input.IsMap();
    if (tokens && input["vocab"]) values.insert(as_int(input["vocab"]));
    std::map<int64_t, int64_t> size;  // old -> new, increasing with the old
    int64_t last = 0;
    for (int64_t v : values) {
        // an attention dim: heads x a head_dim that cuts the k/v projections' rows as evenly as the rest
        const int64_t head_unit = std::lcm<int64_t>(8, cp_shards);
        const int64_t step = dim_heads.count(v) ? std::lcm<int64_t>(dim_heads[v] * head_unit, unit) : unit;
        size[v] = (last / step + 1) * step;
        last = size[v];
    }

    // a pipeline keeps a block per stage (its plan's stages then cut one block each: layers_per_stage
    // 1, as ptool plan --verify writes it) and whole microbatches of 2 rows per data rank
    const int64_t stages = plan.pipeline ? plan.pipeline_stages() : 1,
                  blocks = plan.pipeline ? std::max<int64_t>(2, stages) : 2,
                  per_round = plan.pipeline ? plan.microbatches_per_round() : 1;
    for_each_module(doc["modules"], [&](YAML::Node m) {
        const ShrinkKeys k = keys_of(m);
        if (!k.count.empty() && m[k.count] && as_int(m[k.count]) > blocks) m[k.count] = blocks;
        for (const std::string& key : k.sizes)
            if (m[key] && m[key].IsScalar()) m[key] = size.at(as_int(m[key]));
    });
    const int64_t rows = dp * mb * per_round * 2;
    YAML::Node shape = tokens ? input["tokens"] : input;
    // masked targets: a sequence of at least 8 so that a proxy's rows keep valid targets
    const int64_t seq_unit = 2 * tp * cp_pieces, seq = batch["masked_targets"] && shape.size() > 1
                                                           ? (8 + seq_unit - 1) / seq_unit * seq_unit
                                                           : seq_unit;
    if (batch["masked_targets"] && shape.size() > 1)
        shrink_target_mask(batch["masked_targets"], as_int(shape[1]), seq);
    YAML::Node shrunk(YAML::NodeType::Sequence);
    shrunk.SetStyle(YAML::EmitterStyle::Flow);
    for (size_t i = 0; i < shape.size(); ++i) {
        const int64_t v = as_int(shape[i]);
        // a 1-D batch has no rows to cut: its one dim stays whole (features sized as the modules' are)
        if (shape.size() == 1)
            shrunk.push_back(!tokens && size.count(v) ? size.at(v) : v);
        else if (i == 0)
            shrunk.push_back(rows);
        else if (!tokens && i + 1 == shape.size())
            shrunk.push_back(size.count(v) ? size.at(v) : v);
        else
            shrunk.push_back(i == 1 ? seq : 2 * tp);
    }
    if (tokens) {
        input["tokens"] = shrunk;
        if (input["vocab"]) input["vocab"] = size.at(as_int(input["vocab"]));
    } else {
        batch["input"] = shrunk;
    }
    if (batch["target"]) batch.remove("target");  // its default follows the output
    if (doc["name"]) doc["name"] = doc["name"].Scalar() + "_proxy";
    YAML::Emitter e;
    e << doc;
    return fmt::format(
        "# A proxy of {} for a plan of tp={} dp={}{}{} (ptool shrink; docs/planning.md): the same modules\n"
        "# and names, at most {} blocks per repeat, sizes that still split as the plan splits them.\n{}\n",
        yaml_comment(name), tp, dp,
        plan.context_parallel ? fmt::format(" cp={}", plan.dims.size(DimRole::cp)) : "",
        plan.pipeline ? fmt::format(" pp={} ({} stages)", plan.dims.size(DimRole::pp), stages) : "", blocks,
        e.c_str());
}

}  // namespace ptool
