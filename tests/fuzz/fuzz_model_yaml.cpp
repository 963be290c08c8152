// libFuzzer harness: the model YAML loader. Any input must load or throw InputError; anything else
// (a crash, a sanitizer report, another exception) is a finding. See scripts/fuzz.sh.
#include <cstdint>
#include <string>

#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    ptool::set_model_byte_limit(64 << 20);  // legitimate but huge models are not what is fuzzed
    try {
        ptool::load_model_text(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
    } catch (const ptool::InputError&) {
    }
    return 0;
}
