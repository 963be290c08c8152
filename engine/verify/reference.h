// The single-device reference: full model, full batch, `steps` training steps, as a PyTorch
// training loop would run them (zero_grad, forward, loss, backward, optimizer.step()).
// Each step's results are handed to a callback and can be written in golden format.
#pragma once

#include <functional>

#include "core/safetensors.h"
#include "model/batch.h"

namespace ptool {

struct StepResult {
    int64_t step = 0;  // from 0
    double loss = 0;
    Tensor loss_tensor;  // scalar in the model's dtype
    Tensor output;
    Batch batch;
    std::vector<std::pair<std::string, Tensor>> grads, params, buffers;  // after the optimizer step
    double seconds = 0;  // forward + backward + optimizer
};

struct ReferenceOptions {
    int64_t steps = 1;
    Device device = Device::cpu;
};

void run_reference(Model& model, const DataSource& data, const ReferenceOptions& opt,
                   const std::function<void(const StepResult&)>& on_step);

// Golden-format tensors (DESIGN §3): init.param.*, init.buffer.*, data.* or step{k}.input/target,
// step{k}.loss/output/grad.*/param.*/buffer.*.
class GoldenWriter {
public:
    GoldenWriter(const Model& model, bool data_per_step);
    void add_step(const StepResult& r);
    TensorFile& file() { return file_; }

private:
    TensorFile file_;
    bool per_step_;
};

}  // namespace ptool
