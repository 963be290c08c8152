// A plan's activation_checkpointing: which modules recompute what in backward.
//
//   activation_checkpointing: ["layers.*"]      # full (torch.utils.checkpoint of each module)
//   activation_checkpointing:
//     modules: ["layers.*"]
//     mode: full | op | core_attn                # default full
//     every: 2                                   # every 2nd matching module (default 1: all)
//
//   full       torchtitan's `mode: full`: the module keeps only its input and runs its whole forward
//              again at the start of its backward.
//   op         torchtitan's `mode: selective, selective_ac_option: op`: a checkpointed region that
//              keeps every other matmul's output and SDPA's (model/selective_recompute.h).
//   core_attn  Megatron's `--recompute-granularity selective` (`--recompute-modules core_attn`):
//              nothing is checkpointed; each attention at or under a module keeps q, k and v but
//              not its softmax probabilities, which its backward recomputes. Flash attention
//              recomputes them anyway, so there it changes nothing (a warning).
//   every N    torchtitan's `selective_ac_option: "N"`: of the matching modules in registration
//              order, the N-th, 2N-th, ... (its `_count % N == 0`, counted from 1).
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/diagnostic.h"
#include "core/yaml_reader.h"

namespace ptool {

struct Model;
class Module;

enum class RecomputeMode { full, op, core_attn };
const char* recompute_mode_name(RecomputeMode m);  // "full", "op", "core_attn"

struct ActivationCheckpointingSpec {
    std::vector<std::string> modules;  // FQN patterns; empty: no activation checkpointing
    RecomputeMode mode = RecomputeMode::full;
    int every = 1;
    SourceLocation where;
    bool active() const { return !modules.empty(); }
};

// A list (full, every module) or a map with modules, mode and every. Errors exit 2 at the key.
ActivationCheckpointingSpec parse_activation_checkpointing(const YamlNode& node);

struct ActivationCheckpointing {
    std::set<const Module*> checkpointed;    // regions: keep their input, recompute in backward (full, op)
    std::set<const Module*> selective;       // those of them under the op policy
    std::set<const Module*> recompute_core;  // attention modules that drop their probabilities (core_attn)
    // What m recomputes: "full", "op", "core_attn", or "" (nothing of its own).
    std::string mode_of(const Module* m) const;
    // Keeps the modules keep() accepts (a pipeline stage's own).
    void keep_only(const std::function<bool(const Module*)>& keep);
};

// The modules the spec selects in `model`; warnings for patterns matching nothing, core_attn with
// no eager attention under a module.
ActivationCheckpointing resolve_activation_checkpointing(const Model& model,
                                                         const ActivationCheckpointingSpec& spec,
                                                         std::vector<Diagnostic>& warnings);

}  // namespace ptool
