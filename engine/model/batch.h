// The data a step trains on, and initial parameters from a file.
//
// Without --data, input and target are generated from the counter-based RNG keyed by
// (seed, "data", "input"/"target"): floats ~ N(0, 1), ids uniform in [0, range). The same batch
// is used every step. A --data file (safetensors) overrides them: keys `input`, `target`, and
// per-step `step{k}.input`, `step{k}.target` (k from 0); ids int64 (int32 accepted), floats are
// converted to the model's dtype. --init loads a PyTorch state_dict (strict, as load_state_dict).
#pragma once

#include <optional>

#include "core/safetensors.h"
#include "model/model.h"

namespace ptool {

struct Batch {
    Tensor input;
    Tensor target;  // undefined for losses without a target
};

class DataSource {
public:
    explicit DataSource(const Model& model, const TensorFile* data_file = nullptr,
                        std::string data_path = "");
    Batch batch(int64_t step) const;  // full (global) batch of step k
    bool varies_per_step() const;     // the data file has step{k}.* keys

private:
    Tensor pick(const std::string& key, int64_t step, const TensorSpec& spec, const Tensor& generated) const;
    const Model& model_;
    const TensorFile* file_;
    std::string path_;
    Tensor gen_input_, gen_target_;
};

// A golden-format per-step key, "step{k}.NAME" with k < kMaxSteps written without leading zeros:
// the step and NAME ("loss", "grad.net1.weight", "input"). nullopt for anything else ("step",
// "stepX.loss", "step1", "step01.loss").
struct StepKey {
    int64_t step;
    std::string rest;
    std::string kind() const { return rest.substr(0, rest.find('.')); }  // "grad" of "grad.net1.weight"
};
std::optional<StepKey> parse_step_key(const std::string& name);

// A --data file for a run of `steps` steps: refused (InputError naming the key) when it holds no
// tensor or a step{k} key at or beyond `steps`.
void check_data_steps(const TensorFile& data, const std::string& path, int64_t steps);

// A generated tensor (a pure function of seed, what, shape, dtype and range). Drawn once per
// process and copied to each caller: the reference and every rank thread of a verify ask for the
// same batch, and eight ranks drawing 512x1024 normals each took longer than their GEMMs' share.
// The copy is the caller's own memory (its account's batch), as each rank holds its own batch.
// Under MetaAllocation: the shape only.
Tensor generate_tensor(const TensorSpec& spec, DType float_dtype, uint64_t seed, const std::string& what);

// Copies a state_dict file into the model's parameters and buffers. Missing or unexpected keys
// and shape mismatches are InputError naming them.
void load_state_dict(Model& model, const TensorFile& file, const std::string& path);

}  // namespace ptool
