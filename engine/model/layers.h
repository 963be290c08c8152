// Leaf modules: linear, activations, identity, norms, embedding, dropout.
// Each mirrors its torch.nn counterpart: parameter names, shapes ([out, in] weights) and default init.
#pragma once

#include "comm/communicator.h"
#include "core/rng.h"
#include "model/batch_statistics.h"
#include "model/float8_linear.h"
#include "model/module.h"

namespace ptool {

// nn.Linear: y = x @ W^T + b. weight [out, in], bias [out]. A tied weight is another module's parameter.
class Linear : public Module {
public:
    Linear(std::string name, SourceLocation where, int64_t in, int64_t out, bool bias, DType dtype,
           ParamPtr tied_weight = nullptr);
    Shape output_shape(const Shape& in) const override;
    Placement out_placement(const Layout& in) const override;  // whole rows: not Shard(-1), not Partial
    void init_params(uint64_t seed) override;
    int64_t in_features() const { return in_; }
    int64_t out_features() const { return out_; }
    bool tied() const { return tied_; }
    // Rowwise tensor parallelism adds the bias once, after the reduction: the style's hooks then
    // own the bias and forward/backward here leave it alone.
    void set_defer_bias(bool defer) { defer_bias_ = defer; }
    void init_shard(uint64_t seed, const std::string& name, Tensor& local, int64_t dim,
                    int64_t offset) const override;
    bool set_normal_init(double std) override { return normal_std_ = std, true; }
    KeptOutputs* kept_outputs() override { return &kept_; }
    std::optional<std::pair<int64_t, int64_t>> linear_features() const override {
        return std::make_pair(in_, out_);
    }
    void set_float8(const Float8Gemms& f) override { float8_ = f; }
    const Float8Gemms* float8() const override { return float8_ ? &*float8_ : nullptr; }

protected:
    Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
    Tensor backward_impl(RunContext& ctx, const Tensor& dy) override;

private:
    int64_t in_, out_;
    bool tied_;
    std::optional<Float8Gemms> float8_;
    bool defer_bias_ = false;
    std::optional<double> normal_std_;  // set_normal_init's: weight ~ N(0, std), bias 0
    KeptOutputs kept_;  // selective checkpointing's kept outputs (model/selective_recompute.h)
};

// relu, gelu (erf or tanh), silu, tanh: elementwise, no parameters.
class ActivationModule : public Module {
public:
    ActivationModule(const ModuleType& type, std::string name, SourceLocation where, Activation act)
        : Module(type, std::move(name), std::move(where)), act_(act) {}
    Activation activation() const { return act_; }
    Placement out_placement(const Layout& in) const override;  // not on partial sums

protected:
    Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
    Tensor backward_impl(RunContext& ctx, const Tensor& dy) override;

private:
    Activation act_;
};

class Identity : public Module {
public:
    Identity(std::string name, SourceLocation where);

protected:
    Tensor forward_impl(RunContext&, const Tensor& x) override { return x; }
    Tensor backward_impl(RunContext&, const Tensor& dy) override { return dy; }
};

// nn.LayerNorm / nn.RMSNorm over the last dim: weight [d] (ones), bias [d] (zeros; layer_norm only).
class Norm : public Module {
public:
    // rms: nn.RMSNorm (no mean subtracted, no bias), else nn.LayerNorm. eager: an RMSNorm written
    // out as transformers' LlamaRMSNorm (x.to(float32), x * rsqrt(mean(x^2) + eps), cast back, then
    // weight * h): the same values as ptool computes them, what PyTorch saves for its backward (the
    // float32 upcast and the normalised h, not x) and its kernels' time; else one fused kernel
    // (torch's nn.RMSNorm / nn.LayerNorm: x and its statistics saved).
    Norm(const ModuleType& type, std::string name, SourceLocation where, int64_t dim, double eps, bool affine,
         bool bias, bool rms, DType dtype, bool eager = false);
    Shape output_shape(const Shape& in) const override;
    Placement out_placement(const Layout& in) const override;  // whole rows
    void init_params(uint64_t seed) override;
    bool rms() const { return rms_; }

protected:
    Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
    Tensor backward_impl(RunContext& ctx, const Tensor& dy) override;

private:
    int64_t dim_;
    double eps_;
    bool rms_;
    bool eager_;
};

// nn.BatchNorm1d on [N, C], training mode: batch statistics normalise, running stats
// (momentum 0.1, unbiased variance) are buffers, as is num_batches_tracked.
class BatchNorm : public Module, public BatchStatistics {
public:
    BatchNorm(std::string name, SourceLocation where, int64_t features, double eps, double momentum,
              DType dtype);
    Shape output_shape(const Shape& in) const override;
    Placement out_placement(const Layout& in) const override;  // the whole batch: Replicate only
    void init_params(uint64_t seed) override;
    // SyncBatchNorm: statistics over the batch of every rank of `group` (data parallel). Forward
    // all_gathers each rank's per-channel mean and variance, backward all_reduces sum(dy) and
    // sum(dy * xhat), as torch.nn.SyncBatchNorm. The parameters' own gradients stay local (DDP
    // averages them). nullptr: local statistics.
    void set_sync_group(Communicator* group) override { sync_ = group; }
    bool synced() const override { return sync_ != nullptr; }
    BatchStatistics* batch_statistics() override { return this; }

protected:
    Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
    Tensor backward_impl(RunContext& ctx, const Tensor& dy) override;

private:
    int64_t features_;
    double eps_, momentum_;
    Communicator* sync_ = nullptr;
};

// nn.Embedding: ids [...] -> [..., dim]; weight [num, dim] ~ N(0, 1).
class Embedding : public Module {
public:
    Embedding(std::string name, SourceLocation where, int64_t num, int64_t dim, DType dtype);
    Shape output_shape(const Shape& in) const override;
    Placement out_placement(const Layout& in) const override;  // ids sharded by batch or sequence stay so
    bool takes_ids() const override { return true; }
    void init_params(uint64_t seed) override;
    int64_t vocab() const { return num_; }
    int64_t id_rows() const override { return num_; }
    int64_t dim() const { return dim_; }
    // Vocab-parallel (rowwise): this rank holds rows [offset, offset + weight rows); other ids
    // look up zeros here and the ranks' outputs are summed.
    void set_vocab_offset(int64_t offset) { vocab_offset_ = offset; }
    void init_shard(uint64_t seed, const std::string& name, Tensor& local, int64_t dim,
                    int64_t offset) const override;
    bool set_normal_init(double std) override { return std_ = std, true; }

protected:
    Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
    Tensor backward_impl(RunContext& ctx, const Tensor& dy) override;

private:
    Tensor local_ids(const Tensor& ids) const;
    int64_t num_, dim_;
    int64_t vocab_offset_ = -1;  // -1: the whole vocabulary
    double std_ = 1.0;           // N(0, 1) as nn.Embedding, or set_normal_init's
};

// GPT-2's learned positions (HF `wpe`): y = x + weight[0:T] for x [batch, T, dim]; weight
// [positions, dim] ~ N(0, 1) as nn.Embedding. Rows of the batch may be sharded (data parallel);
// the sequence and the features must be whole (each row of the weight is a position).
class PositionEmbedding : public Module {
public:
    PositionEmbedding(std::string name, SourceLocation where, int64_t positions, int64_t dim, DType dtype);
    Shape output_shape(const Shape& in) const override;
    Placement out_placement(const Layout& in) const override;
    void init_params(uint64_t seed) override;
    bool set_normal_init(double std) override { return std_ = std, true; }

protected:
    Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
    Tensor backward_impl(RunContext& ctx, const Tensor& dy) override;

private:
    Tensor position_ids(const RunContext& ctx, const Tensor& x) const;
    int64_t positions_, dim_;
    double std_ = 1.0;
};

// nn.Dropout(p). The mask is drawn from the counter-based RNG keyed by (seed, step, module) at
// each element's index in the whole tensor: its global batch row (data parallel) and, for a shard,
// its place in the full activation (tensor parallel) -- Megatron's model-parallel RNG semantics:
// a sharded activation's mask equals the reference's, a replicated region draws the same mask on
// every tp rank. Identity in eval mode.
class Dropout : public Module {
public:
    Dropout(std::string name, SourceLocation where, double p);
    double p() const { return p_; }
    std::optional<double> drop_probability() const override { return p_; }
    // The scaled keep mask (0 or 1/(1-p)) of this rank's piece of the activation x.
    Tensor mask(const RunContext& ctx, const Placed& x) const;

protected:
    Placed forward_placed(RunContext& ctx, const Placed& x) override;
    Tensor backward_impl(RunContext& ctx, const Tensor& dy) override;

private:
    double p_;
};

// Fills t with U(-bound, bound) drawn for (seed, "init", fqn), element i from index i.
void init_uniform(Tensor& t, uint64_t seed, const std::string& fqn, double bound);
// The same for a shard: local element i takes the draw of full element global_index(i).
void init_uniform_shard(Tensor& t, uint64_t seed, const std::string& fqn, double bound, const Shape& full,
                        int64_t dim, int64_t offset);
void init_normal(Tensor& t, uint64_t seed, const std::string& fqn, double stddev);
void init_normal_shard(Tensor& t, uint64_t seed, const std::string& fqn, double stddev, const Shape& full,
                       int64_t dim, int64_t offset);
void fill_value(Tensor& t, double value);  // host-side fill, for init
// N(0, stddev) from rng, element i from index i (generated data: its own stream)
void fill_normal(Tensor& t, const CounterRng& rng, double stddev);

}  // namespace ptool
