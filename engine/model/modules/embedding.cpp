// embedding: nn.Embedding, ids [...] -> [..., dim]; vocabulary-parallel under rowwise (each rank
// holds a range of rows, other ids look up zeros and the ranks' outputs are summed).
#include "model/layers.h"
#include "model/module_type.h"

namespace ptool {
namespace {

// embedding: vocab, dim.
class EmbeddingType final : public ModuleType {
public:
    EmbeddingType() : ModuleType("embedding", 100) {}
    std::shared_ptr<Module> build(ModuleBuilder& b, ModuleEntry& e) const override {
        const int64_t vocab = e.positive("vocab"), dim = e.positive("dim");
        b.account(e.keys.at("dim"), size_mul(e.keys.at("dim"), vocab, dim));
        return std::make_shared<Embedding>(e.name, e.where, vocab, dim, b.dtype());
    }
    TpTemplate tp_template() const override { return {.rule = TpRule::embedding}; }
    ShrinkKeys shrink_keys() const override { return {.sizes = {"vocab", "dim"}}; }
};
const EmbeddingType embedding_type;
PTOOL_REGISTER_MODULE_TYPE(embedding_type);

}  // namespace

Embedding::Embedding(std::string name, SourceLocation where, int64_t num, int64_t dim, DType dtype)
    : Module(embedding_type, std::move(name), std::move(where)), num_(num), dim_(dim) {
    register_param("weight", make_param({num, dim}, dtype));
}

Shape Embedding::output_shape(const Shape& in) const {
    Shape out = in;
    out.push_back(dim_);
    return out;
}

Placement Embedding::out_placement(const Layout& in) const {
    if (in.p.is_partial()) conflict(fmt::format("'{}' (embedding) needs whole ids, not partial sums", fqn()));
    return in.p.normalized(static_cast<int64_t>(in.global.size()));
}

void Embedding::init_params(uint64_t seed) {
    init_normal(param("weight")->value, seed, join_name(fqn(), "weight"), std_);
}

void Embedding::init_shard(uint64_t seed, const std::string&, Tensor& local, int64_t dim,
                           int64_t offset) const {
    if (dim < 0) return init_normal(local, seed, join_name(fqn(), "weight"), std_);
    init_normal_shard(local, seed, join_name(fqn(), "weight"), std_, {num_, dim_}, dim, offset);
}

Tensor Embedding::local_ids(const Tensor& ids) const {
    if (vocab_offset_ < 0) return ids;
    if (ids.device() == Device::meta)
        return Tensor(ids.shape(), DType::int64, Device::meta);  // no ids to map
    const int64_t rows = param("weight")->value.size(0);
    const Tensor host = ids.device() == Device::cpu ? ids : ids.to_device(Device::cpu);
    Tensor local(ids.shape(), DType::int64);
    for (int64_t i = 0; i < ids.numel(); ++i) {
        const int64_t id = id_at(host, i) - vocab_offset_;
        local.data<int64_t>()[i] = id >= 0 && id < rows ? id : -1;  // -1: another rank's row
    }
    return ids.device() == Device::cpu ? local : local.to_device(ids.device());
}

Tensor Embedding::forward_impl(RunContext& ctx, const Tensor& ids) {
    PTOOL_REQUIRE(!dtype_is_float(ids.dtype()), "embedding '{}' needs integer ids, got {}", fqn(),
                  dtype_name(ids.dtype()));
    const Tensor& w = param("weight")->value;
    Shape out = ids.shape();
    out.push_back(w.size(1));  // dim, or dim/tp under colwise
    Tensor y = Tensor::empty(out, w.dtype(), ids.device());
    const Tensor local = local_ids(ids);
    ctx.backend->embedding(local, w, y);
    save({local});
    return y;
}

Tensor Embedding::backward_impl(RunContext& ctx, const Tensor& dy) {
    const Tensor ids = restore()[0];
    defer_weights(ctx, [ids, dy, w = param("weight")](RunContext& c) {
        c.backend->embedding_backward(ids, dy, w->grad);
    });
    return Tensor();  // ids have no gradient
}

}  // namespace ptool
