// dlopen/dlsym for the CUDA libraries ptool loads on first use (cuBLAS, NCCL): linking them
// would cost every process their static initialisation, CPU runs included.
#pragma once

#include <dlfcn.h>

#include <mutex>
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

// The symbols of an opened library, for filling a table: sym("name", table.entry) is false, with
// the error set, when the library lacks the symbol.
class DlSymbols {
public:
    DlSymbols(void* lib, const char* library, std::string& error)
        : lib_(lib), library_(library), error_(error) {}
    template <class F>
    bool operator()(const char* name, F& out) const {
        return dl_resolve(lib_, library_, name, out, error_);
    }

private:
    void* lib_;
    const char* library_;
    std::string& error_;
};

// A table of function pointers from a library opened on first use (thread-safe): get() is the
// table, or nullptr when the library or one of its symbols is missing, and error() says which.
template <class Api>
class LazyLibrary {
public:
    using Fill = bool (*)(const DlSymbols& sym, Api& api);  // resolves every entry
    LazyLibrary(std::string soname, const char* library, Fill fill)
        : soname_(std::move(soname)), library_(library), fill_(fill) {}

    const Api* get() {
        std::call_once(once_, [this] {
            if (void* lib = dl_open(soname_, error_)) loaded_ = fill_(DlSymbols(lib, library_, error_), api_);
        });
        return loaded_ ? &api_ : nullptr;
    }
    const std::string& error() {
        get();
        return error_;
    }

private:
    std::string soname_;
    const char* library_;
    Fill fill_;
    std::once_flag once_;
    Api api_{};
    bool loaded_ = false;
    std::string error_;
};

}  // namespace ptool::cuda
