#include "verify/reference.h"

#include <chrono>

#include "model/loss.h"
#include "model/optimizer.h"

namespace ptool {

void run_reference(Model& model, const DataSource& data, const ReferenceOptions& opt,
                   const std::function<void(const StepResult&)>& on_step) {
    Backend& be = backend_for(opt.device);
    model.to_device(opt.device);  // built and initialised on the host
    const auto to_host = [](const Tensor& t) { return t.to_device(Device::cpu); };  // a copy, also on the host
    Optimizer optimizer(model.optimizer, be);
    const auto params = model.named_parameters();
    const auto buffers = model.named_buffers();
    for (int64_t step = 0; step < opt.steps; ++step) {
        StepResult r;
        r.step = step;
        r.batch = data.batch(step);
        const Tensor input = r.batch.input.to_device(opt.device);
        const Tensor target = r.batch.target.defined() ? r.batch.target.to_device(opt.device) : Tensor();
        const auto t0 = std::chrono::steady_clock::now();
        for (const auto& [name, p] : params) be.fill(p->grad, 0.0);
        RunContext ctx{&be, model.seed, step, true, 0, {}};
        const Tensor output = model.root->forward(ctx, input);
        LossResult loss = compute_loss(be, model.loss, output, target);
        model.root->backward(ctx, loss.grad);
        optimizer.step(params);
        be.synchronize();  // the step's kernels are done before it is timed
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.output = to_host(output);
        r.loss = loss.value;
        r.loss_tensor = Tensor::scalar(loss.value, model.dtype);
        for (const auto& [name, p] : params) {
            r.grads.emplace_back(name, to_host(p->grad));
            r.params.emplace_back(name, to_host(p->value));
        }
        for (const auto& [name, b] : buffers) r.buffers.emplace_back(name, to_host(b->value));
        on_step(r);
    }
}

GoldenWriter::GoldenWriter(const Model& model, bool data_per_step) : per_step_(data_per_step) {
    for (const auto& [name, p] : model.named_parameters()) file_.add("init.param." + name, p->value.clone());
    for (const auto& [name, b] : model.named_buffers()) file_.add("init.buffer." + name, b->value.clone());
}

void GoldenWriter::add_step(const StepResult& r) {
    const std::string s = fmt::format("step{}.", r.step);
    if (per_step_) {
        file_.add(s + "input", r.batch.input);
        if (r.batch.target.defined()) file_.add(s + "target", r.batch.target);
    } else if (r.step == 0) {
        file_.add("data.input", r.batch.input);
        if (r.batch.target.defined()) file_.add("data.target", r.batch.target);
    }
    file_.add(s + "loss", r.loss_tensor);
    file_.add(s + "output", r.output);
    for (const auto& [name, t] : r.grads) file_.add(s + "grad." + name, t);
    for (const auto& [name, t] : r.params) file_.add(s + "param." + name, t);
    for (const auto& [name, t] : r.buffers) file_.add(s + "buffer." + name, t);
}

}  // namespace ptool
