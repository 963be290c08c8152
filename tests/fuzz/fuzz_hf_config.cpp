// libFuzzer harness: `ptool import hf` and `import hf-tp-plan` on a config.json. Any input must be
// refused with InputError (strict JSON, typed fields, what ptool does not model) or imported; an
// import's YAML must then load as a model (shape-only, as the CLI checks it) and as a plan, and
// every string the config put into it must read back as the config said (no injected keys). Anything
// else (a crash, a sanitizer report, another exception, a generated file that does not load) is a
// finding. Seeded with tests/data/hf/*.json. See scripts/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "import/hf_import.h"
#include "model/model.h"
#include "parallel/plan.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail) {
    std::fprintf(stderr, "%s: %s\n", what, detail.c_str());
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    ptool::HfImportOptions opt;
    opt.seq = 8;  // the default (the config's max positions, up to 2048) makes large batches the fuzzer does
                  // not need
    for (int tp_plan = 0; tp_plan < 2; ++tp_plan) {
        ptool::HfImport r;
        try {
            r = tp_plan ? ptool::import_hf_tp_plan_text(text, "config.json", opt)
                        : ptool::import_hf_model_text(text, "config.json", opt);
        } catch (const ptool::InputError&) {
            continue;
        }
        try {
            if (tp_plan) {
                ptool::load_plan_text(r.yaml, "imported_plan.yaml");
            } else {
                ptool::MetaAllocation meta;
                ptool::load_model_text(r.yaml, "imported_model.yaml", "", false);
            }
        } catch (const ptool::InputError& e) {
            finding("an imported file does not load", std::string(e.what()) + "\n" + r.yaml);
        }
    }
    return 0;
}
