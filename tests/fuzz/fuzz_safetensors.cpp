// libFuzzer harness: the safetensors reader (header length, JSON, dtypes, shapes, offsets).
#include <cstdint>
#include <string>

#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        ptool::parse_safetensors(std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
    } catch (const ptool::InputError&) {
    }
    return 0;
}
