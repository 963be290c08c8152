// Model YAML -> module tree. Every key is checked: the model's here, each module's by its type's
// parse rule (model/module_type.h, model/modules/*.cpp); defaults and names follow torch.nn.
#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/fqn_pattern.h"
#include "core/yaml_reader.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// The names a container's children take in its namespace: a transparent child's (an unnamed
// residual or sequential) are its children's, as if they were written in the parent.
void names_in_scope(const std::string& name, const Module& child, std::vector<std::string>& out) {
    if (!child.transparent()) return out.push_back(name);
    for (const auto& [n, c] : child.children()) names_in_scope(n, *c, out);
}

int64_t numel_checked(const YamlNode& where, const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n = size_mul(where, n, d);
    return n;
}

int64_t parse_byte_count(const char* text) {  // "8589934592", "8G", "512M", "none"
    if (!text || !*text) return -1;
    if (std::string(text) == "none" || std::string(text) == "0") return 0;
    // digits with at most one decimal point, then a unit or nothing: strtod alone took " 8G", "0x10"
    // and "1e3"
    const std::string all(text);
    const size_t digits = all.find_first_not_of("0123456789.");
    const std::string number = all.substr(0, digits),
                      unit = digits == std::string::npos ? "" : all.substr(digits);
    const bool well_formed = !number.empty() && std::isdigit(static_cast<unsigned char>(number[0])) &&
                             std::count(number.begin(), number.end(), '.') <= 1 && number.back() != '.';
    const double v = well_formed ? std::strtod(number.c_str(), nullptr) : -1.0;
    const double scale = unit.empty()  ? 1
                         : unit == "K" ? 1024.0
                         : unit == "M" ? 1048576.0
                         : unit == "G" ? 1073741824.0
                         : unit == "T" ? 1099511627776.0
                                       : -1;
    if (!(v * scale >= 1) || scale < 0 || v * scale > 9e18)  // (0.5 bytes truncated to 0, which is none)
        throw InputError(fmt::format(
            "PTOOL_MODEL_BYTE_LIMIT='{}': expected bytes, e.g. 8589934592, 8G or 512M, or none", text));
    return static_cast<int64_t>(v * scale);
}

// The most bytes of parameters and batch a model may have when it is built: 8 GiB unless the
// environment says otherwise (PTOOL_MODEL_BYTE_LIMIT; set_model_byte_limit for the fuzzers).
int64_t& byte_limit() {
    static int64_t limit = [] {
        const int64_t env = parse_byte_count(std::getenv("PTOOL_MODEL_BYTE_LIMIT"));
        return env >= 0 ? env : int64_t{8} << 30;
    }();
    return limit;
}

// The loader's side of a type's build (model/module_type.h): the byte limit, names, children.
class Builder final : public ModuleBuilder {
public:
    explicit Builder(DType dtype) : dtype_(dtype) {}
    DType dtype() const override { return dtype_; }

    using ModuleBuilder::account;
    void account(const YamlNode& where, int64_t elements, DType dtype) override {
        bytes_ = size_add(where, bytes_, size_mul(where, elements, static_cast<int64_t>(dtype_size(dtype))));
        if (byte_limit() > 0 && bytes_ > byte_limit() &&
            !meta_allocation_active())  // meta models allocate nothing
            where.fail(
                fmt::format("the model reaches {} bytes of parameters and batch, over the limit of {} "
                            "(PTOOL_MODEL_BYTE_LIMIT raises it)",
                            bytes_, byte_limit()));
    }

    std::shared_ptr<Module> lookup(const YamlNode& where, const std::string& fqn, const char* key) override {
        auto it = by_fqn_.find(fqn);
        if (it == by_fqn_.end()) {
            std::vector<std::string> names;
            for (const auto& [n, m] : by_fqn_) names.push_back(n);
            where.fail(fmt::format("'{}: {}' names no earlier module{}", key, fqn, did_you_mean(fqn, names)));
        }
        return it->second;
    }

    void children(YamlMap& m, Module& parent, const std::string& prefix) override {
        std::set<std::string> names;
        for (const YamlNode& item : m.at("modules").items(fmt::format("'modules' of '{}'", prefix))) {
            auto [name, child] = build(item, prefix);
            std::vector<std::string> scoped;
            names_in_scope(name, *child, scoped);
            for (const std::string& n : scoped)
                if (!names.insert(n).second)
                    item.fail(fmt::format("duplicate module name '{}'", join_name(prefix, n)));
            parent.add_child(name, child);
        }
        if (names.empty())
            m.at("modules").fail(fmt::format("'{}' has no modules", prefix.empty() ? "model" : prefix));
    }

    void name_module(const std::string& fqn, std::shared_ptr<Module> m) override {
        by_fqn_.emplace(fqn, std::move(m));
    }

private:
    std::pair<std::string, std::shared_ptr<Module>> build(const YamlNode& node, const std::string& prefix) {
        YamlMap m(node, "a module");
        // a residual or sequential without a name is transparent: its modules keep the parent's
        // prefix (the structure of a forward() that owns no submodule, e.g. HF's decoder layers)
        auto may_be_transparent = [&] {
            const ModuleType* t = find_module_type(m.at("type").as_string("'type'"));
            return t && t->transparent_without_name();
        };
        const bool transparent = !m.has("name") && m.has("type") && may_be_transparent();
        const std::string name = transparent ? "" : m.at("name").as_string("a module's 'name'");
        if (!transparent && (name.empty() || name.find_first_of(". \t") != std::string::npos))
            m.at("name").fail(
                fmt::format("module name '{}' must be non-empty, without dots or spaces", name));
        // nor control bytes (NUL, an escape sequence): a name goes into reports, CSV and the terminal
        if (const auto bad =
                std::find_if(name.begin(), name.end(),
                             [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
            bad != name.end())
            m.at("name").fail(fmt::format("module name holds the control byte 0x{:02x} at {}",
                                          static_cast<unsigned char>(*bad), bad - name.begin()));
        const std::string fqn = join_name(prefix, name);
        YamlNode type_node = m.at("type");
        const std::string type = type_node.as_string("'type'");
        const std::string what = fmt::format("{} '{}'", type, fqn);
        YamlMap mm(node, what);  // re-read with a precise description for the messages below
        if (!transparent) mm.at("name");
        mm.at("type");
        const ModuleType* t = find_module_type(type);
        if (!t)
            type_node.fail(
                fmt::format("unknown module type '{}'{}", type, did_you_mean(type, module_type_names())));
        ModuleEntry entry{mm, name, fqn, node.where()};
        nested_.push_back(0);
        std::shared_ptr<Module> mod = t->build(*this, entry);
        count_modules(node, *mod, t->aliases());
        mm.finish();
        mod->set_fqn(fqn);
        if (transparent)
            mod->set_transparent();
        else if (!t->aliases())
            by_fqn_.emplace(fqn, mod);
        return {name, mod};
    }

    // The modules an entry built that no entry nested in it counted (its type's own: a moe's experts,
    // a repeat's blocks), against kMaxModules; an alias (`shared`) builds none.
    void count_modules(const YamlNode& node, const Module& mod, bool alias) {
        const int64_t below = nested_.back(), size = modules_under(mod);
        nested_.pop_back();
        if (!nested_.empty()) nested_.back() += size;  // a container's walk meets them again
        if (alias) return;
        modules_ += size - below;
        if (modules_ > kMaxModules)
            node.fail(
                fmt::format("the model reaches {} modules (each module a type builds inside an entry "
                            "counted: a moe's gate, experts and their 3 projections, an attention's "
                            "4), over ptool's limit of {}: fewer layers or experts",
                            modules_, kMaxModules));
    }

    DType dtype_;
    int64_t modules_ = 0;          // modules built so far
    std::vector<int64_t> nested_;  // per build under way: the modules its nested builds counted
    int64_t bytes_ = 0;            // parameters, buffers and batch counted so far
    std::map<std::string, std::shared_ptr<Module>> by_fqn_;  // every module built so far
};

TensorSpec parse_tensor_spec(const YamlNode& node, const std::string& what) {
    TensorSpec spec;
    if (node.is_seq()) {
        spec.shape = node.as_shape(what);
        return spec;
    }
    YamlMap m(node, what);
    spec.shape = m.at("tokens").as_shape(fmt::format("'tokens' of {}", what));
    spec.ids = true;
    spec.range = m.at("vocab").as_positive_int(fmt::format("'vocab' of {}", what));
    m.finish();
    return spec;
}

OptimizerSpec parse_optimizer(const YamlNode& node) {
    YamlMap m(node, "the optimizer");
    OptimizerSpec o;
    YamlNode type = m.at("type");
    const std::string name = type.as_string("optimizer 'type'");
    auto kind = [&] {
        for (OptimizerType t : {OptimizerType::sgd, OptimizerType::adamw})
            if (name == optimizer_name(t)) return t;
        type.fail(fmt::format("unknown optimizer '{}'{}", name, did_you_mean(name, {"sgd", "adamw"})));
    };
    o.type = kind();
    if (o.type == OptimizerType::sgd) {
        o.lr = m.double_or("lr", 1e-3);
        o.momentum = m.double_or("momentum", 0.0);
        o.weight_decay = m.double_or("weight_decay", 0.0);
    } else {
        o.lr = m.double_or("lr", 1e-3);
        o.weight_decay = m.double_or("weight_decay", 1e-2);
        o.eps = m.double_or("eps", 1e-8);
        if (auto b = m.get("betas")) {
            auto items = b->items("'betas'");
            if (items.size() != 2) b->fail("'betas' must be [beta1, beta2]");
            o.beta1 = items[0].as_double("beta1");
            o.beta2 = items[1].as_double("beta2");
            if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1))
                b->fail("betas must be in [0, 1)");
        }
        if (m.has("implementation")) {
            YamlNode impl = m.at("implementation");
            const std::string v = impl.as_string("optimizer 'implementation'");
            if (v != "foreach" && v != "fused")
                impl.fail(
                    fmt::format("optimizer implementation '{}': valid: foreach (torch.optim.AdamW's "
                                "default on CUDA), fused",
                                v));
            o.fused = v == "fused";
        }
    }
    if (!(o.lr >= 0)) m.at("lr").fail("lr must be >= 0");
    // torch.optim's own checks ("Invalid momentum value", "Invalid weight_decay value", "Invalid epsilon
    // value")
    if (!(o.momentum >= 0)) m.at("momentum").fail("momentum must be >= 0");
    if (!(o.weight_decay >= 0)) m.at("weight_decay").fail("weight_decay must be >= 0");
    if (!(o.eps >= 0)) m.at("eps").fail("eps must be >= 0");
    m.finish();
    return o;
}

// [lo, hi] with 0 <= lo <= hi, or one number n for [n, n]
std::pair<int64_t, int64_t> parse_length_range(const YamlNode& node, const std::string& what) {
    if (!node.is_seq()) {
        const int64_t n = node.as_int(what);
        if (n < 0) node.fail(fmt::format("{} must be >= 0, got {}", what, n));
        return {n, n};
    }
    const std::vector<YamlNode> items = node.items(what);
    if (items.size() != 2) node.fail(fmt::format("{} must be [lo, hi] (or one length)", what));
    const int64_t lo = items[0].as_int(what), hi = items[1].as_int(what);
    if (lo < 0 || hi < lo) node.fail(fmt::format("{} [{}, {}] needs 0 <= lo <= hi", what, lo, hi));
    return {lo, hi};
}

TargetMaskSpec parse_target_mask(const YamlNode& node) {
    YamlMap m(node, "'batch.masked_targets'");
    TargetMaskSpec s;
    if (auto p = m.get("prompt")) std::tie(s.prompt_lo, s.prompt_hi) = parse_length_range(*p, "'prompt'");
    if (auto p = m.get("padding")) std::tie(s.padding_lo, s.padding_hi) = parse_length_range(*p, "'padding'");
    if (auto f = m.get("fraction")) {
        s.fraction = f->as_double("'fraction'");
        if (!(s.fraction >= 0 && s.fraction <= 1)) f->fail("'fraction' must be in [0, 1]");
    }
    m.finish();
    return s;
}

double positive_std(const YamlNode& node, const std::string& what) {
    const double v = node.as_double(what);
    if (!(v > 0) || !std::isfinite(v))
        node.fail(fmt::format("{} must be a finite number > 0, got {}", what, v));
    return v;
}

// init: {std, std_by_param: {PATTERN: std}}; each module that has a weight takes the std of its
// weight's FQN (set_normal_init), and a pattern no weight matches is an error at the pattern
InitScheme apply_init_scheme(const YamlNode& node, Sequential& root) {
    YamlMap m(node, "'init'");
    InitScheme s;
    if (auto v = m.get("std")) s.std = positive_std(*v, "'init.std'");
    std::vector<std::pair<YamlNode, bool>> patterns;  // each pattern's key, and whether it matched
    if (auto by = m.get("std_by_param")) {
        if (!by->is_map()) by->fail("'std_by_param' must be a map of parameter patterns to a std");
        for (const auto& kv : by->raw()) {
            YamlNode key(kv.first, std::make_shared<std::string>(by->file())),
                value(kv.second, std::make_shared<std::string>(by->file()));
            s.std_by_param.emplace_back(key.as_string("a std_by_param pattern"),
                                        positive_std(value, "a std_by_param std"));
            patterns.emplace_back(key, false);
        }
    }
    m.finish();
    for_each_module(root, [&](const std::string& fqn, Module& mod) {
        const std::string weight = join_name(fqn, "weight");
        double std = s.std;
        for (size_t i = 0; i < s.std_by_param.size(); ++i)
            if (fqn_matches(s.std_by_param[i].first, weight)) {
                std = s.std_by_param[i].second;
                if (mod.set_normal_init(std)) patterns[i].second = true;
                break;
            }
        mod.set_normal_init(std);
    });
    for (const auto& [key, matched] : patterns)
        if (!matched)
            key.fail(fmt::format(
                "std_by_param '{}' matches no linear's, embedding's or position embedding's weight",
                key.as_string("a pattern")));
    return s;
}

LossKind parse_loss(const YamlNode& node) {
    const std::string s = node.as_string("'loss'");
    for (LossKind k : {LossKind::sum, LossKind::mean, LossKind::mse, LossKind::cross_entropy})
        if (s == loss_name(k)) return k;
    node.fail(
        fmt::format("unknown loss '{}'{}", s, did_you_mean(s, {"sum", "mean", "mse", "cross_entropy"})));
}

}  // namespace

void set_model_byte_limit(int64_t bytes) {
    byte_limit() = bytes;
}

const char* loss_normalization_name(LossNormalization n) {
    switch (n) {
        case LossNormalization::mean_per_call:
            return "mean_per_call";
        case LossNormalization::global_tokens:
            return "global_tokens";
    }
    return "?";
}

LossNormalization parse_loss_normalization(const std::string& name, const SourceLocation& where) {
    for (LossNormalization n : {LossNormalization::mean_per_call, LossNormalization::global_tokens})
        if (name == loss_normalization_name(n)) return n;
    throw InputError(where, fmt::format("unknown loss_normalization '{}'{}", name,
                                        did_you_mean(name, {"mean_per_call", "global_tokens"})));
}

void check_loss_normalization(LossNormalization n, LossKind loss, const SourceLocation& where) {
    if (n == LossNormalization::global_tokens && loss == LossKind::sum)
        throw InputError(where,
                         "loss_normalization: global_tokens divides the step's summed loss by its items "
                         "(valid targets, or elements); loss: sum has none to count (use cross_entropy, "
                         "mse or mean)");
}

const char* loss_name(LossKind k) {
    switch (k) {
        case LossKind::sum:
            return "sum";
        case LossKind::mean:
            return "mean";
        case LossKind::mse:
            return "mse";
        case LossKind::cross_entropy:
            return "cross_entropy";
    }
    return "?";
}

Model load_model_text(const std::string& text, const std::string& path, const std::string& dtype_override,
                      bool init) {
    return load_model_document(load_yaml_text(text, path), path, dtype_override, init);
}

namespace {

// The training settings beside the batch and the modules: the loss and its options, the optimizer,
// gradient accumulation, clipping, the checkpoint format.
void read_training(YamlMap& m, const YamlNode& root, Model& model) {
    if (auto l = m.get("loss")) model.loss = parse_loss(*l);
    if (auto i = m.get("ignore_index")) {
        model.ignore_index = i->as_int("'ignore_index'");
        if (model.loss != LossKind::cross_entropy)  // PyTorch's mse_loss has none: it would mean nothing
            i->fail(fmt::format("ignore_index is cross_entropy's (the loss is {})", loss_name(model.loss)));
    }
    model.loss_normalization_where = root.where();
    if (auto n = m.get("loss_normalization")) {
        model.loss_normalization = parse_loss_normalization(n->as_string("'loss_normalization'"), n->where());
        model.loss_normalization_where = n->where();
        check_loss_normalization(model.loss_normalization, model.loss, n->where());
    }
    if (auto o = m.get("optimizer")) model.optimizer = parse_optimizer(*o);
    if (auto g = m.get("gradient_accumulation")) {
        model.gradient_accumulation = g->as_positive_int("'gradient_accumulation'");
        if (model.gradient_accumulation > kMaxGradientAccumulation)
            g->fail(fmt::format("gradient_accumulation {} is over the limit of {}",
                                model.gradient_accumulation, kMaxGradientAccumulation));
        const int64_t rows = model.input.shape.empty() ? 1 : model.input.shape[0];
        if (rows % model.gradient_accumulation != 0)
            g->fail(fmt::format(
                "gradient_accumulation {} does not divide the batch's {} rows into equal microbatches",
                model.gradient_accumulation, rows));
    }
    if (auto c = m.get("clip_grad_norm")) {
        // 0 clips nothing (the default; transformers' max_grad_norm 0 turns clipping off as well)
        model.clip_grad_norm = c->as_double("'clip_grad_norm'");
        if (!(model.clip_grad_norm >= 0) || !std::isfinite(model.clip_grad_norm))
            c->fail(fmt::format("clip_grad_norm must be a finite number >= 0 (0: no clipping), got {}",
                                model.clip_grad_norm));
        model.clip_grad_norm = std::max(model.clip_grad_norm, 0.0);  // -0 as 0
    }

    if (auto f = m.get("checkpoint_format")) {
        model.checkpoint_format = f->as_string("'checkpoint_format'");
        const auto& known = checkpoint_formats();
        if (std::find(known.begin(), known.end(), model.checkpoint_format) == known.end())
            f->fail(fmt::format("unknown checkpoint_format '{}'{}", model.checkpoint_format,
                                did_you_mean(model.checkpoint_format, known)));
    }
}

// The loss's target against the model's output: cross_entropy's class ids along the output's last
// dim (drawn where the batch does not give them), mse's float target of the output's shape, and a
// target mask only where cross_entropy reads it.
void check_loss_target(Model& model, YamlMap& m, YamlMap& batch, const std::optional<YamlNode>& mask_node) {
    const Shape& out = model.output_shape;
    if (model.loss == LossKind::cross_entropy) {
        if (out.size() < 2)  // PyTorch's unbatched [C] has no row to split across ranks or microbatches
            m.at("loss").fail(
                fmt::format("cross_entropy reads class scores along the output's last dim, one "
                            "target id for each row before it ([N, C] or [.., C]), but the output "
                            "is {}: it needs at least 2 dims",
                            shape_str(out)));
        Shape want(out.begin(), out.end() - 1);
        if (!model.target) model.target = TensorSpec{want, true, out.back()};
        if (model.target->shape != want)
            batch.at("target").fail(fmt::format("cross_entropy on output {} needs target {}, got {}",
                                                shape_str(out), shape_str(want),
                                                shape_str(model.target->shape)));
        model.target->ids = true;
        model.target->range = out.back();
        if (model.target_mask && (model.target_mask->prompt_hi > 0 || model.target_mask->padding_hi > 0) &&
            want.size() < 2)
            mask_node->fail(
                fmt::format("'prompt' and 'padding' mask the start and end of each row's sequence "
                            "(dim 1), but the targets are {}: use 'fraction'",
                            shape_str(want)));
    } else if (model.loss == LossKind::mse) {
        if (!model.target) model.target = TensorSpec{out, false, 0};
        if (model.target->shape != out || model.target->ids)
            batch.at("target").fail(
                fmt::format("mse on output {} needs a float target of the same shape", shape_str(out)));
    }
    if (model.target_mask && model.loss != LossKind::cross_entropy)
        mask_node->fail(
            fmt::format("masked_targets sets class ids to ignore_index, which only cross_entropy "
                        "reads (the loss is {})",
                        loss_name(model.loss)));
}

}  // namespace

Model load_model_document(const YamlNode& root, const std::string& path, const std::string& dtype_override,
                          bool init) {
    YamlMap m(root, "the model");
    Model model;
    model.path = path;
    model.name = m.string_or("name", std::filesystem::path(path).stem().string());
    if (auto d = m.get("dtype")) {
        try {
            model.dtype = parse_dtype(d->as_string("'dtype'"));
        } catch (const InputError& e) {
            d->fail(e.message());
        }
    }
    if (!dtype_override.empty()) model.dtype = parse_dtype(dtype_override);
    model.seed = static_cast<uint64_t>(m.int_or("seed", 0));
    model.steps = m.has("steps") ? m.at("steps").as_positive_int("'steps'") : 1;
    if (model.steps > kMaxSteps)
        m.at("steps").fail(fmt::format("steps {} is over the limit of {}", model.steps, kMaxSteps));
    YamlMap batch(m.at("batch"), "'batch'");
    model.input = parse_tensor_spec(batch.at("input"), "'batch.input'");
    if (auto t = batch.get("target")) model.target = parse_tensor_spec(*t, "'batch.target'");
    std::optional<YamlNode> mask_node = batch.get("masked_targets");
    if (mask_node)
        model.target_mask = parse_target_mask(*mask_node), model.target_mask_where = mask_node->where();
    batch.finish();
    read_training(m, root, model);

    Builder b(model.dtype);
    b.account(batch.node(),
              size_add(batch.node(), numel_checked(batch.at("input"), model.input.shape),
                       model.target ? numel_checked(batch.at("target"), model.target->shape) : 0));
    model.root = std::make_shared<Sequential>("", root.where());
    b.children(m, *model.root, "");
    const std::optional<YamlNode> init_node = m.get("init");
    m.finish();
    for_each_module(*model.root, [](const std::string& fqn, Module& mod) { mod.set_fqn(fqn); });
    if (const int64_t calls = modules_under(*model.root); calls > kMaxModuleCalls)
        m.at("modules").fail(
            fmt::format("a forward of the model calls {} modules (each call site of "
                        "a shared module counted: shared modules nested in shared ones "
                        "multiply their calls), over ptool's limit of {}",
                        calls, kMaxModuleCalls));
    if (init_node) model.init = apply_init_scheme(*init_node, *model.root);

    // Shape inference over the whole tree: every size error is found before any compute.
    if (model.input.ids != model.root->takes_ids())
        m.at("batch").fail(model.input.ids
                               ? "batch.input is tokens, but the first module is not an embedding"
                               : "the first module is an embedding: batch.input must be {tokens, vocab}");
    model.output_shape = model.root->output_shape(model.input.shape);
    if (model.input.ids) {  // the ids drawn must be rows of the embedding that looks them up
        const Module* first = model.root.get();
        while (!first->children().empty()) first = first->children()[0].second.get();
        if (const int64_t rows = first->id_rows(); rows > 0 && model.input.range > rows)
            batch.at("input").fail(
                fmt::format("batch.input draws ids from [0, {}) but embedding '{}' has {} rows: its vocab "
                            "must be at most {}",
                            model.input.range, first->fqn(), rows, rows));
    }
    check_loss_target(model, m, batch, mask_node);
    if (init) model.init_params();
    return model;
}

Model load_model(const std::string& path, const std::string& dtype_override) {
    return load_model_text(read_file(path, YamlLimits{}.max_bytes), path, dtype_override);
}

}  // namespace ptool
