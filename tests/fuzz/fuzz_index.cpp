// libFuzzer harness: a sharded checkpoint's index (model.safetensors.index.json) and the shards
// it names, through read_checkpoint (model/checkpoint.h). The input is written as the index of a
// folder that also holds two small valid shards, `a.safetensors` and `b.safetensors`; any index
// must load (every tensor from the shard it names) or throw InputError, and a name must never reach
// a file outside the folder (a NUL, a '/', '..'). Anything else is a finding. Seeded with indexes of
// the two shards. See scripts/fuzz.sh.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/temp_paths.h"
#include "model/checkpoint.h"

namespace {

struct Folder {
    ptool::TempDir dir{"ptool-fuzz-index"};
    std::string index = dir.path() + "/model.safetensors.index.json";
    Folder() {
        ptool::TensorFile a, b;
        a.add("w", ptool::Tensor::zeros({2, 3}, ptool::DType::float32));
        a.add("x", ptool::Tensor::zeros({4}, ptool::DType::float32));
        b.add("y", ptool::Tensor::zeros({1, 2}, ptool::DType::bfloat16));
        ptool::write_safetensors(dir.path() + "/a.safetensors", a);
        ptool::write_safetensors(dir.path() + "/b.safetensors", b);
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static Folder folder;
    {
        std::ofstream out(folder.index, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    }
    try {
        const ptool::TensorFile f = ptool::read_checkpoint(folder.index);
        for (const auto& [name, t] : f.tensors)
            if (name != "w" && name != "x" && name != "y")
                std::fprintf(stderr, "loaded a tensor no shard holds: %s\n", name.c_str()), std::abort();
    } catch (const ptool::InputError&) {
    }
    return 0;
}
