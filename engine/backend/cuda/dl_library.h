// dlopen/dlsym for the CUDA libraries ptool loads on first use (cuBLAS, NCCL): linking them
// would cost every process their static initialisation, CPU runs included.
#pragma once

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace ptool::cuda {

// The library, or nullptr with error set to "cannot load SONAME: why".
inline void* dl_open(const std::string& soname, std::string& error) {
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* why = dlerror();
        error = fmt::format("cannot load {}: {}", soname, why ? why : "unknown error");
    }
    return lib;
}

// out := the symbol; false with error set when the library lacks it.
template <class F>
bool dl_resolve(void* lib, const char* library, const char* name, F& out, std::string& error) {
    out = reinterpret_cast<F>(dlsym(lib, name));
    if (!out) error = fmt::format("{} has no symbol {}", library, name);
    return out != nullptr;
}

}  // namespace ptool::cuda
