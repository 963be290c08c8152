// Mixed precision, as FSDP2's MixedPrecisionPolicy and DDP's _MixedPrecision run it: the model's
// parameters stay in its dtype and are what the optimizer steps (the masters); forward and
// backward compute with copies in param_dtype; the gradients are reduced across dp ranks in
// reduce_dtype and land in the masters' dtype.
//
// fully_shard casts the parameters it manages itself (it gathers them in param_dtype and
// reduce_scatters in reduce_dtype: parallel/fully_shard.h); DataParallel's buckets hold
// reduce_dtype. This file holds the rest: a step's compute copies of every other parameter (DDP's
// and the single-device reference's), with their gradients accumulated in param_dtype over the
// step's microbatches (as DDP's no_sync accumulates into the low-precision parameters' .grad).
//
// What ptool decides where PyTorch leaves it to the training script (docs/architecture.md):
// the loss is computed in the model's dtype on the output cast up (torchtitan's cross_entropy
// casts the logits to float), and its gradient is cast to param_dtype for the backward.
#pragma once

#include <functional>
#include <map>

#include "model/model.h"
#include "parallel/plan.h"

namespace ptool {

class MixedPrecision {
public:
    // The parameters `managed_elsewhere` rejects (fully_shard's) are left to it. Nothing to do when
    // param_dtype is the model's dtype. float8_units (FQN patterns, "" the root): the weight of a
    // float8 linear under one of them has as its compute copy its float8 codes, cast from the master
    // with the master's scale (Parameter::float8_scale), as FSDP2's float8 all-gather casts the
    // master shards of those units (Float8Spec::weights_from_masters); picked by name as fully_shard
    // picks them (a `.weight` whose module is a float8 linear: a tied weight goes by its first name).
    MixedPrecision(Model& model, const MixedPrecisionSpec& spec, Backend& be,
                   const std::function<bool(const Parameter*)>& managed_elsewhere,
                   const std::vector<std::string>& float8_units = {});

    DType compute_dtype() const { return spec_.param_dtype; }
    const MixedPrecisionSpec& spec() const { return spec_; }

    // Before the step's first forward: each parameter's value becomes its param_dtype copy of the
    // master and its gradient a zeroed param_dtype tensor.
    void to_compute();
    // After the step's last backward, before the gradient sync: the gradients cast into the
    // masters' gradient tensors (whatever views DDP made of them) and the masters restored.
    void to_masters();

private:
    struct Entry {
        ParamPtr p;
        Tensor master, master_grad, value, grad;
        const Float8Gemms* float8 = nullptr;  // under float8_units: the float8 linear it is the weight of
    };
    static std::map<const Parameter*, const Float8Gemms*> float8_weights(
        const Model& model, const std::vector<std::string>& float8_units);
    Tensor float8_copy(Entry& e) const;
    MixedPrecisionSpec spec_;
    Backend& be_;
    std::vector<Entry> entries_;
};

// A model the policy can run, or InputError at the policy: every parameter is one data_parallel
// casts (none ignored, none outside the replicate() roots: PyTorch would meet its full-precision
// weights with low-precision activations), no BatchNorm (its running statistics are buffers no
// policy here casts), and with cast_forward_inputs off only a model whose input is not floating.
void check_mixed_precision(const Model& model, const Plan& plan,
                           const std::vector<std::string>& unmanaged_params);

}  // namespace ptool
