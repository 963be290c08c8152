// Model YAML -> module tree. Every key is checked; module types, defaults and names follow torch.nn.
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/yaml_reader.h"
#include "model/checkpoint.h"
#include "model/model.h"

namespace ptool {
namespace {

const std::vector<std::string> kModuleTypes = {
    "linear",     "relu",      "gelu",      "silu",      "tanh",     "identity",  "layer_norm",
    "rms_norm",   "batch_norm", "embedding", "position_embedding", "dropout",   "attention", "gated_mlp",
    "sequential", "repeat",     "residual",  "shared"};

// The names a container's children take in its namespace: a transparent child's (an unnamed
// residual or sequential) are its children's, as if they were written in the parent.
void names_in_scope(const std::string& name, const Module& child, std::vector<std::string>& out) {
    if (!child.transparent()) return out.push_back(name);
    for (const auto& [n, c] : child.children()) names_in_scope(n, *c, out);
}

// A product of sizes, or InputError at `where` when it leaves int64.
int64_t mul(const YamlNode& where, int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) where.fail(fmt::format("sizes overflow: {} x {} is beyond 2^63", a, b));
    return r;
}

int64_t add(const YamlNode& where, int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) where.fail(fmt::format("sizes overflow: {} + {} is beyond 2^63", a, b));
    return r;
}

int64_t numel_checked(const YamlNode& where, const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n = mul(where, n, d);
    return n;
}

int64_t parse_byte_count(const char* text) {  // "8589934592", "8G", "512M", "none"
    if (!text || !*text) return -1;
    if (std::string(text) == "none" || std::string(text) == "0") return 0;
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    const std::string unit = end ? end : "";
    const double scale = unit.empty() ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : unit == "G" ? 1073741824.0
                       : unit == "T" ? 1099511627776.0 : -1;
    if (!(v > 0) || scale < 0 || v * scale > 9e18)
        throw InputError(fmt::format("PTOOL_MODEL_BYTE_LIMIT='{}': expected bytes, e.g. 8589934592, 8G or 512M, or none", text));
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

struct Builder {
    DType dtype;
    int64_t bytes = 0;  // parameters built so far

    // Called before each parameterised module is built, with its parameter count.
    void account(const YamlNode& where, int64_t params) {
        bytes = add(where, bytes, mul(where, params, static_cast<int64_t>(dtype_size(dtype))));
        if (byte_limit() > 0 && bytes > byte_limit() && !meta_allocation_active())  // meta models allocate nothing
            where.fail(fmt::format("the model reaches {} bytes of parameters and batch, over the limit of {} "
                                   "(PTOOL_MODEL_BYTE_LIMIT raises it)",
                                   bytes, byte_limit()));
    }
    std::map<std::string, std::shared_ptr<Module>> by_fqn;  // every module built so far

    std::shared_ptr<Module> lookup(YamlNode where, const std::string& fqn, const char* key) {
        auto it = by_fqn.find(fqn);
        if (it == by_fqn.end()) {
            std::vector<std::string> names;
            for (const auto& [n, m] : by_fqn) names.push_back(n);
            where.fail(fmt::format("'{}: {}' names no earlier module{}", key, fqn, did_you_mean(fqn, names)));
        }
        return it->second;
    }

    Activation activation_of(YamlMap& m, const std::string& key, const std::string& fallback) {
        std::string a = m.string_or(key, fallback);
        if (a == "silu") return Activation::silu;
        if (a == "relu") return Activation::relu;
        if (a == "gelu") return Activation::gelu;
        if (a == "tanh") return Activation::tanh;
        m.at(key).fail(fmt::format("unknown activation '{}' (valid: silu, relu, gelu, tanh)", a));
    }

    void children(YamlMap& m, Module& parent, const std::string& prefix) {
        std::set<std::string> names;
        for (const YamlNode& item : m.at("modules").items(fmt::format("'modules' of '{}'", prefix))) {
            auto [name, child] = build(item, prefix);
            std::vector<std::string> scoped;
            names_in_scope(name, *child, scoped);
            for (const std::string& n : scoped)
                if (!names.insert(n).second) item.fail(fmt::format("duplicate module name '{}'", join_name(prefix, n)));
            parent.add_child(name, child);
        }
        if (names.empty()) m.at("modules").fail(fmt::format("'{}' has no modules", prefix.empty() ? "model" : prefix));
    }

    std::pair<std::string, std::shared_ptr<Module>> build(const YamlNode& node, const std::string& prefix) {
        YamlMap m(node, "a module");
        // a residual or sequential without a name is transparent: its modules keep the parent's
        // prefix (the structure of a forward() that owns no submodule, e.g. HF's decoder layers)
        const bool transparent = !m.has("name") && m.has("type") && (m.at("type").as_string("'type'") == "residual" ||
                                                                      m.at("type").as_string("'type'") == "sequential");
        const std::string name = transparent ? "" : m.at("name").as_string("a module's 'name'");
        if (!transparent && (name.empty() || name.find_first_of(". \t") != std::string::npos))
            m.at("name").fail(fmt::format("module name '{}' must be non-empty, without dots or spaces", name));
        const std::string fqn = join_name(prefix, name);
        YamlNode type_node = m.at("type");
        const std::string type = type_node.as_string("'type'");
        const std::string what = fmt::format("{} '{}'", type, fqn);
        YamlMap mm(node, what);  // re-read with a precise description for the messages below
        if (!transparent) mm.at("name");
        mm.at("type");
        std::shared_ptr<Module> mod = make(mm, type, type_node, name, fqn, node.where());
        mm.finish();
        mod->set_fqn(fqn);
        if (transparent) mod->set_transparent();
        else if (type != "shared") by_fqn.emplace(fqn, mod);
        return {name, mod};
    }

    std::shared_ptr<Module> make(YamlMap& m, const std::string& type, const YamlNode& type_node,
                                 const std::string& name, const std::string& fqn, const SourceLocation& where) {
        auto pos = [&](const char* key) { return m.at(key).as_positive_int(fmt::format("'{}'", key)); };
        if (type == "linear") {
            const int64_t in = pos("in"), out = pos("out");
            account(m.at("out"), add(m.node(), mul(m.at("out"), in, out), out));
            ParamPtr tied;
            if (auto t = m.get("tie")) {
                auto target = lookup(*t, t->as_string("'tie'"), "tie");
                tied = target->param("weight");
                if (!tied) t->fail(fmt::format("'tie: {}' names a module with no weight", target->fqn()));
                if (tied->value.shape() != Shape{out, in})
                    t->fail(fmt::format("'tie: {}' weight is {}, but this linear needs [{}, {}] ([out, in])",
                                        target->fqn(), shape_str(tied->value.shape()), out, in));
            }
            return std::make_shared<Linear>(name, where, in, out, m.bool_or("bias", true), dtype, tied);
        }
        if (type == "relu") return std::make_shared<ActivationModule>(type, name, where, Activation::relu);
        if (type == "silu") return std::make_shared<ActivationModule>(type, name, where, Activation::silu);
        if (type == "tanh") return std::make_shared<ActivationModule>(type, name, where, Activation::tanh);
        if (type == "gelu") {
            std::string approx = m.string_or("approximate", "none");
            if (approx != "none" && approx != "tanh")
                m.at("approximate").fail(fmt::format("gelu approximate must be none or tanh, got '{}'", approx));
            return std::make_shared<ActivationModule>(type, name, where,
                                                      approx == "tanh" ? Activation::gelu_tanh : Activation::gelu);
        }
        if (type == "identity") return std::make_shared<Identity>(name, where);
        if (type == "layer_norm" || type == "rms_norm" || type == "batch_norm")
            account(m.node(), mul(m.node(), 4, pos(type == "batch_norm" ? "features" : "dim")));
        if (type == "layer_norm" || type == "rms_norm") {
            // nn.LayerNorm eps 1e-5; nn.RMSNorm eps=None means torch.finfo(dtype).eps
            const double default_eps = type == "layer_norm" ? 1e-5 : dtype_eps(dtype);
            const bool bias = type == "layer_norm" && m.bool_or("bias", true);
            return std::make_shared<Norm>(type, name, where, pos("dim"), m.double_or("eps", default_eps),
                                          m.bool_or("elementwise_affine", true), bias, dtype);
        }
        if (type == "batch_norm")
            return std::make_shared<BatchNorm>(name, where, pos("features"), m.double_or("eps", 1e-5),
                                               m.double_or("momentum", 0.1), dtype);
        if (type == "embedding") {
            const int64_t vocab = pos("vocab"), dim = pos("dim");
            account(m.at("dim"), mul(m.at("dim"), vocab, dim));
            return std::make_shared<Embedding>(name, where, vocab, dim, dtype);
        }
        if (type == "position_embedding") {
            const int64_t positions = pos("positions"), dim = pos("dim");
            account(m.at("dim"), mul(m.at("dim"), positions, dim));
            return std::make_shared<PositionEmbedding>(name, where, positions, dim, dtype);
        }
        if (type == "dropout") {
            const double p = m.double_or("p", 0.5);
            if (!(p >= 0.0 && p < 1.0)) m.at("p").fail(fmt::format("dropout p must be in [0, 1), got {}", p));
            return std::make_shared<Dropout>(name, where, p);
        }
        if (type == "attention") {
            const int64_t heads = pos("heads");
            const int64_t adim = pos("dim");
            account(m.at("dim"), mul(m.at("dim"), 4, mul(m.at("dim"), adim, add(m.at("dim"), adim, 1))));
            Attention::Options o;
            o.dim = adim, o.heads = heads, o.kv_heads = m.has("kv_heads") ? pos("kv_heads") : heads;
            o.causal = m.bool_or("causal", false);
            const bool bias = m.bool_or("bias", true);  // bias sets both; qkv_bias and o_bias each their own
            o.qkv_bias = m.bool_or("qkv_bias", bias), o.o_bias = m.bool_or("o_bias", bias);
            if (auto impl = m.get("attn_implementation")) {
                const std::string v = impl->as_string("'attn_implementation'");
                if (v != "eager" && v != "flash") impl->fail(fmt::format("attn_implementation '{}': valid: eager, flash", v));
                o.flash = v == "flash";
            }
            if (auto r = m.get("rope_theta")) {
                o.rope_theta = r->as_double("'rope_theta'");
                if (!(*o.rope_theta > 0) || !std::isfinite(*o.rope_theta)) r->fail(fmt::format("rope_theta must be > 0, got {}", *o.rope_theta));
            }
            if (auto rs = m.get("rope_scaling")) {
                if (!o.rope_theta) rs->fail("rope_scaling needs rope_theta (RoPE)");
                YamlMap sm(*rs, "'rope_scaling'");
                YamlNode type = sm.at("type");
                o.rope_scaling.type = type.as_string("rope_scaling 'type'");
                if (o.rope_scaling.type != "linear" && o.rope_scaling.type != "llama3")
                    type.fail(fmt::format("rope_scaling type '{}'{}", o.rope_scaling.type,
                                          did_you_mean(o.rope_scaling.type, {"linear", "llama3"})));
                auto positive = [&](const char* key, double fallback) {
                    const double v = sm.double_or(key, fallback);
                    if (!(v > 0) || !std::isfinite(v)) sm.at(key).fail(fmt::format("rope_scaling {} must be a finite number > 0", key));
                    return v;
                };
                o.rope_scaling.factor = positive("factor", 1.0);
                if (o.rope_scaling.type == "llama3") {
                    o.rope_scaling.low_freq_factor = positive("low_freq_factor", 1.0);
                    o.rope_scaling.high_freq_factor = positive("high_freq_factor", 4.0);
                    o.rope_scaling.original_max_position_embeddings = positive("original_max_position_embeddings", 8192.0);
                    if (!(o.rope_scaling.high_freq_factor > o.rope_scaling.low_freq_factor))
                        sm.at("high_freq_factor").fail("rope_scaling high_freq_factor must be above low_freq_factor");
                }
                sm.finish();
            }
            return std::make_shared<Attention>(name, where, o, dtype);
        }
        if (type == "gated_mlp") {
            const int64_t gdim = pos("dim"), hidden = pos("hidden");
            account(m.at("hidden"), mul(m.at("hidden"), 3, mul(m.at("hidden"), gdim, hidden)));
        }
        if (type == "gated_mlp")
            return std::make_shared<GatedMlp>(name, where, pos("dim"), pos("hidden"),
                                              activation_of(m, "activation", "silu"), m.bool_or("bias", false), dtype);
        if (type == "sequential" || type == "residual") {
            std::shared_ptr<Sequential> s;
            if (type == "residual") s = std::make_shared<Residual>(name, where);
            else s = std::make_shared<Sequential>(type, name, where);
            children(m, *s, fqn);
            return s;
        }
        if (type == "repeat") {
            const int64_t count = pos("count");
            if (count > 4096) m.at("count").fail("repeat count over 4096");
            auto list = std::make_shared<Sequential>("repeat", name, where);
            for (int64_t i = 0; i < count; ++i) {  // each copy's modules account for themselves
                auto copy = std::make_shared<Sequential>("sequential", std::to_string(i), where);
                const std::string cfqn = join_name(fqn, std::to_string(i));
                copy->set_fqn(cfqn);
                children(m, *copy, cfqn);
                by_fqn.emplace(cfqn, copy);
                list->add_child(std::to_string(i), copy);
            }
            return list;
        }
        if (type == "shared") {
            YamlNode target = m.at("module");
            return lookup(target, target.as_string("'module'"), "module");
        }
        type_node.fail(fmt::format("unknown module type '{}'{}", type, did_you_mean(type, kModuleTypes)));
    }
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
    o.type = type.as_string("optimizer 'type'");
    if (o.type == "sgd") {
        o.lr = m.double_or("lr", 1e-3);
        o.momentum = m.double_or("momentum", 0.0);
        o.weight_decay = m.double_or("weight_decay", 0.0);
    } else if (o.type == "adamw") {
        o.lr = m.double_or("lr", 1e-3);
        o.weight_decay = m.double_or("weight_decay", 1e-2);
        o.eps = m.double_or("eps", 1e-8);
        if (auto b = m.get("betas")) {
            auto items = b->items("'betas'");
            if (items.size() != 2) b->fail("'betas' must be [beta1, beta2]");
            o.beta1 = items[0].as_double("beta1");
            o.beta2 = items[1].as_double("beta2");
            if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)) b->fail("betas must be in [0, 1)");
        }
    } else {
        type.fail(fmt::format("unknown optimizer '{}'{}", o.type, did_you_mean(o.type, {"sgd", "adamw"})));
    }
    if (!(o.lr >= 0)) m.at("lr").fail("lr must be >= 0");
    // torch.optim's own checks ("Invalid momentum value", "Invalid weight_decay value", "Invalid epsilon value")
    if (!(o.momentum >= 0)) m.at("momentum").fail("momentum must be >= 0");
    if (!(o.weight_decay >= 0)) m.at("weight_decay").fail("weight_decay must be >= 0");
    if (!(o.eps >= 0)) m.at("eps").fail("eps must be >= 0");
    m.finish();
    return o;
}

LossKind parse_loss(const YamlNode& node) {
    const std::string s = node.as_string("'loss'");
    for (LossKind k : {LossKind::sum, LossKind::mean, LossKind::mse, LossKind::cross_entropy})
        if (s == loss_name(k)) return k;
    node.fail(fmt::format("unknown loss '{}'{}", s, did_you_mean(s, {"sum", "mean", "mse", "cross_entropy"})));
}

}  // namespace

void set_model_byte_limit(int64_t bytes) { byte_limit() = bytes; }

const char* loss_name(LossKind k) {
    switch (k) {
        case LossKind::sum: return "sum";
        case LossKind::mean: return "mean";
        case LossKind::mse: return "mse";
        case LossKind::cross_entropy: return "cross_entropy";
    }
    return "?";
}

Model load_model_text(const std::string& text, const std::string& path, const std::string& dtype_override, bool init) {
    YamlNode root = load_yaml_text(text, path);
    YamlMap m(root, "the model");
    Model model;
    model.path = path;
    model.yaml_text = text;
    model.name = m.string_or("name", std::filesystem::path(path).stem().string());
    if (auto d = m.get("dtype")) {
        try {
            model.dtype = parse_dtype(d->as_string("'dtype'"));
        } catch (const InputError& e) {
            d->fail(e.what());
        }
    }
    if (!dtype_override.empty()) model.dtype = parse_dtype(dtype_override);
    model.seed = static_cast<uint64_t>(m.int_or("seed", 0));
    model.steps = m.has("steps") ? m.at("steps").as_positive_int("'steps'") : 1;
    if (model.steps > kMaxSteps) m.at("steps").fail(fmt::format("steps {} is over the limit of {}", model.steps, kMaxSteps));
    YamlMap batch(m.at("batch"), "'batch'");
    model.input = parse_tensor_spec(batch.at("input"), "'batch.input'");
    if (auto t = batch.get("target")) model.target = parse_tensor_spec(*t, "'batch.target'");
    batch.finish();
    if (auto l = m.get("loss")) model.loss = parse_loss(*l);
    if (auto o = m.get("optimizer")) model.optimizer = parse_optimizer(*o);
    if (auto g = m.get("gradient_accumulation")) {
        model.gradient_accumulation = g->as_positive_int("'gradient_accumulation'");
        const int64_t rows = model.input.shape.empty() ? 1 : model.input.shape[0];
        if (rows % model.gradient_accumulation != 0)
            g->fail(fmt::format("gradient_accumulation {} does not divide the batch's {} rows into equal microbatches",
                                model.gradient_accumulation, rows));
    }
    if (auto c = m.get("clip_grad_norm")) {
        model.clip_grad_norm = c->as_double("'clip_grad_norm'");
        if (!(model.clip_grad_norm > 0) || !std::isfinite(model.clip_grad_norm))
            c->fail(fmt::format("clip_grad_norm must be a finite number > 0, got {}", model.clip_grad_norm));
    }

    if (auto f = m.get("checkpoint_format")) {
        model.checkpoint_format = f->as_string("'checkpoint_format'");
        const auto& known = checkpoint_formats();
        if (std::find(known.begin(), known.end(), model.checkpoint_format) == known.end())
            f->fail(fmt::format("unknown checkpoint_format '{}'{}", model.checkpoint_format, did_you_mean(model.checkpoint_format, known)));
    }

    Builder b{model.dtype, 0, {}};
    b.account(batch.node(), add(batch.node(), numel_checked(batch.at("input"), model.input.shape),
                                model.target ? numel_checked(batch.at("target"), model.target->shape) : 0));
    model.root = std::make_shared<Sequential>("sequential", "", root.where());
    b.children(m, *model.root, "");
    m.finish();
    for_each_module(*model.root, [](const std::string& fqn, Module& mod) { mod.set_fqn(fqn); });

    // Shape inference over the whole tree: every size error is found before any compute.
    if (model.input.ids != model.root->takes_ids())
        m.at("batch").fail(model.input.ids ? "batch.input is tokens, but the first module is not an embedding"
                                           : "the first module is an embedding: batch.input must be {tokens, vocab}");
    model.output_shape = model.root->output_shape(model.input.shape);
    if (model.input.ids) {  // the ids drawn must be rows of the embedding that looks them up
        const Module* first = model.root.get();
        while (!first->children().empty()) first = first->children()[0].second.get();
        if (const auto* e = dynamic_cast<const Embedding*>(first); e && model.input.range > e->vocab())
            batch.at("input").fail(fmt::format("batch.input draws ids from [0, {}) but embedding '{}' has {} rows: its vocab "
                                               "must be at most {}",
                                               model.input.range, e->fqn(), e->vocab(), e->vocab()));
    }
    const Shape& out = model.output_shape;
    if (model.loss == LossKind::cross_entropy) {
        Shape want(out.begin(), out.end() - 1);
        if (!model.target) model.target = TensorSpec{want, true, out.back()};
        if (model.target->shape != want)
            batch.at("target").fail(fmt::format("cross_entropy on output {} needs target {}, got {}", shape_str(out),
                                                shape_str(want), shape_str(model.target->shape)));
        model.target->ids = true;
        model.target->range = out.back();
    } else if (model.loss == LossKind::mse) {
        if (!model.target) model.target = TensorSpec{out, false, 0};
        if (model.target->shape != out || model.target->ids)
            batch.at("target").fail(fmt::format("mse on output {} needs a float target of the same shape",
                                                shape_str(out)));
    }
    if (init) model.init_params();
    return model;
}

Model load_model(const std::string& path, const std::string& dtype_override) {
    return load_model_text(read_file(path, YamlLimits{}.max_bytes), path, dtype_override);
}

}  // namespace ptool
