// libFuzzer harness: the plan YAML loader and its resolution against a small model.
#include <cstdint>
#include <string>

#include "parallel/parallelize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static ptool::Model model = ptool::load_model_text(
        "batch: {input: [4, 8]}\nmodules:\n  - {name: net1, type: linear, in: 8, out: 16}\n"
        "  - {name: relu, type: relu}\n  - {name: net2, type: linear, in: 16, out: 8}\n",
        "model.yaml");
    try {
        ptool::Plan plan =
            ptool::load_plan_text(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
        ptool::resolve_plan(model, plan);
    } catch (const ptool::InputError&) {
    }
    return 0;
}
