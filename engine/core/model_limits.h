// The bounds on what a model may ask for that are not sizes of one tensor (those are checked
// products, model/module_type.h): shared by the model loader and `import hf`, which refuses a config
// at its own field rather than in the YAML it would write.
#pragma once

#include <cstdint>

namespace ptool {

// The most modules a model may have, every module a type builds inside an entry counted (a moe's
// gate, experts and their projections: 4 per expert); exit 2 at the entry that passes it. Cost: a
// module is built, walked by the layout pass and simulated by explain once per rank class and
// microbatch, so a model is kept to what these do in seconds (DeepSeek-V3's 61 layers of 256
// experts are 63k modules; explain of 66k took 5.6 s on the 2-core machine, 2026-11-28).
constexpr int64_t kMaxModules = int64_t{1} << 17;

// The most module calls one forward may make, each call site of a `shared` module counted: aliases
// nested in aliases multiply them (40 levels of two aliases each: 2^40 calls, which hung at the
// model's shape inference); exit 2 at the model's modules.
constexpr int64_t kMaxModuleCalls = int64_t{1} << 20;

}  // namespace ptool
