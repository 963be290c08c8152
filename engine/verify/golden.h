// Golden files: a case (model + plan) recorded in the golden format (DESIGN §3), replayed later.
//
//   init.param.{fqn}, init.buffer.{fqn}, data.input/target (or step{k}.input/target),
//   step{k}.loss/output/grad.{fqn}/param.{fqn}/buffer.{fqn} of the single-device reference;
//   __metadata__: model_yaml, plan_yaml, model_hash, plan_hash (FNV-1a 64, hex: detects edits,
//   not tampering), model_path, plan_path, dtype, device, steps, rtol, atol, ptool_version,
//   openblas, mpi, cuda, gpu.
// Replaying loads the golden's own initial parameters and data, so a golden recorded by another
// framework (tools/torch_golden.py) replays the same way.
#pragma once

#include "core/safetensors.h"
#include "verify/verify.h"

namespace ptool {

std::string text_hash(const std::string& text);  // FNV-1a 64, 16 hex digits

// Runs the reference of (model, plan) and returns the golden file's tensors and metadata.
TensorFile record_golden(const VerifyInputs& in, const Plan& plan, const VerifyOptions& opt);

struct GoldenCase {
    std::string path;
    TensorFile file;
    std::string model_yaml, plan_yaml, model_path, plan_path;
    std::string stale;  // why the case no longer matches its files ("" when it does)
};

// Reads and validates a golden file (exit 2 on a damaged one: missing metadata or tensors).
GoldenCase load_golden(const std::string& path);

// Compares a run with a golden file's recorded steps: one report row per golden step tensor.
PlanReport compare_with_golden(const RunRecord& run, const TensorFile& golden, const Tolerance& tol,
                               const std::string& label);

// Expands files and folders (every *.safetensors in a folder, sorted) into golden file paths.
std::vector<std::string> golden_paths(const std::vector<std::string>& args);
bool looks_like_golden_arg(const std::string& arg);  // a folder or a .safetensors file

}  // namespace ptool
