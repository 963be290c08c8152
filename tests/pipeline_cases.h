// Two pipeline stages against one device, shared by the rank-threads test (test_schedule.cpp) and
// the mpirun one (test_pipeline_mpi.cpp): each stage's parameters, gradients, outputs and losses
// after every step must equal, bitwise, those of the one-stage run with the same microbatches, as
// torch.distributed.pipelining's own tests hold a pipelined model to its single-device run.
#pragma once

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "train/run.h"

namespace ptool::pipeline_test {

struct Case {
    std::string model, split;  // a shipped model and the spine module stage 1 starts at
    ScheduleKind schedule;
    int microbatches;  // per round
    int rounds = 1;    // the model's gradient_accumulation: the schedule runs this many times a step
};

// An MLP under SGD with 4 microbatches, and with two rounds of 2; a Llama with rotary attention,
// AdamW and clipping (the norm over both stages) with 2.
inline std::vector<Case> cases() {
    std::vector<Case> out;
    for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
        out.push_back({"mlp_stacked", "layers.1", k, 4});
        out.push_back({"mlp_stacked", "layers.1", k, 2, 2});
        out.push_back({"llama_rope", "layers.1", k, 2});
    }
    return out;
}

struct Snapshot {  // one rank's tensors after one step
    std::map<std::string, std::vector<double>> grads, values;
    std::vector<std::vector<double>> outputs;
    double loss = 0;
};

inline RunInputs inputs(const Case& c) {
    RunInputs in;
    in.model_path = std::string(PTOOL_SOURCE_DIR) + "/models/" + c.model + ".yaml";
    std::ifstream f(in.model_path);
    std::stringstream ss;
    ss << f.rdbuf();
    static const std::regex line(R"(\ngradient_accumulation: *\d+)");
    in.model_text = std::regex_replace(ss.str(), line, "") +
                    "\ngradient_accumulation: " + std::to_string(c.rounds) + "\n";
    return in;
}

inline Plan pipeline_plan(const Case& c) {
    Plan p;
    p.path = p.name = "two_stages";
    p.dims = ParallelDims({{"pp", 2}}, {DimRole::pp});
    p.pipeline = PipelineSpec{};
    p.pipeline->split_points = {c.split};
    p.pipeline->schedule = c.schedule;
    p.pipeline->microbatches = c.microbatches;
    return p;
}

// The one-device run the pipeline is held to: the same microbatches, one stage.
inline Plan one_device_plan(const Case& c) {
    return reference_plan(pipeline_plan(c));
}

inline Snapshot snapshot(const Run& run, const StepOutput& s) {
    Snapshot out;
    out.loss = s.loss;
    for (const Placed& o : s.outputs) out.outputs.push_back(o.t.to_doubles());
    for (const auto& [name, p] : run.model().named_parameters())
        out.grads[name] = p->grad.to_doubles(), out.values[name] = p->value.to_doubles();
    return out;
}

// Steps `steps` steps of run, a snapshot after each.
inline std::vector<Snapshot> steps_of(Run& run, int steps) {
    std::vector<Snapshot> out;
    for (int k = 0; k < steps; ++k) {
        const StepOutput s = run.step(k);
        out.push_back(snapshot(run, s));
    }
    return out;
}

// What differs between a stage's snapshot and the one-stage run's (empty: bitwise the same).
inline std::vector<std::string> differences(const Snapshot& one, const Snapshot& stage, bool last, int step) {
    std::vector<std::string> out;
    if (stage.values.empty()) out.push_back(fmt::format("step {}: the stage holds no parameters", step));
    for (const auto& [name, v] : stage.values) {
        if (!one.values.count(name)) {
            out.push_back(fmt::format("step {}: '{}' is no parameter of the model", step, name));
            continue;
        }
        if (v != one.values.at(name))
            out.push_back(fmt::format("step {}: parameter '{}' differs", step, name));
        if (stage.grads.at(name) != one.grads.at(name))
            out.push_back(fmt::format("step {}: gradient of '{}' differs", step, name));
    }
    if (last) {
        if (stage.loss != one.loss)
            out.push_back(fmt::format("step {}: loss {} vs {}", step, stage.loss, one.loss));
        if (stage.outputs != one.outputs) out.push_back(fmt::format("step {}: outputs differ", step));
    } else if (!stage.outputs.empty()) {
        out.push_back(fmt::format("step {}: a stage before the last returned outputs", step));
    }
    return out;
}

}  // namespace ptool::pipeline_test
