// Golden files: a case (model + plan) recorded in the golden format, replayed later. The format,
// in one place:
//
//   init.param.{fqn}, init.buffer.{fqn}         the initial state (named_parameters, named_buffers)
//   data.input, data.target                     the batch, when every step uses the same one,
//     or step{k}.input, step{k}.target          per step (k from 0)
//   step{k}.loss, .output, .grad.{fqn}, .param.{fqn}, .buffer.{fqn}
//                                               the single-device reference after step k
//   __metadata__: model_yaml, plan_yaml, model_hash, plan_hash (FNV-1a 64, hex: detects edits, not
//   tampering), model_path, plan_path, dtype, device, steps, rtol, atol, ptool_version, openblas,
//   mpi, cuda, gpu, gpu_sms, cublas, nccl.
// Replaying loads the golden's own initial parameters and data, so a golden recorded by another
// framework (tools/torch_golden.py) replays the same way (verify/golden_replay.h).
#pragma once

#include "core/safetensors.h"
#include "verify/verify.h"

namespace ptool {

std::string text_hash(const std::string& text);  // FNV-1a 64, 16 hex digits

// A recorded reference's tensors in the golden format (the record kept its init tensors); the
// batches come from `in`'s data (or the model's generated batch).
TensorFile golden_tensors(const RunRecord& reference, const RunInputs& in, int64_t steps);

// Runs the reference of (model, plan) and returns the golden file's tensors and metadata.
TensorFile record_golden(const RunInputs& in, const Plan& plan, const VerifyOptions& opt);

struct GoldenCase {
    std::string path;
    TensorFile file;
    std::string model_yaml, plan_yaml, model_path, plan_path;
    std::string stale;  // why the case no longer matches its files ("" when it does)
    int64_t steps = 0;  // as recorded (0: not recorded)
    Tolerance::Override tolerance;
    int64_t compact_sample = 0;  // a compact golden's sample size (verify/golden_compact.h); 0: full
    // the dtype it was recorded in (`golden record --dtype`; "" where the file names none): a
    // replay runs in it unless told otherwise (a bf16 golden replayed in the model's float32 failed)
    std::string dtype;
};

// Reads and validates a golden file (exit 2 on a damaged one: missing metadata, metadata that is
// not what a plan would accept, step keys that are not canonical). The hashes are checked first:
// a case whose text was edited is STALE and nothing is built from it.
GoldenCase load_golden(const std::string& path);

// Every tensor a golden must hold for its model over `steps` steps (exit 2 naming the first missing):
// init.param.* and init.buffer.* of every parameter and buffer, the data, and per step the loss,
// output, every gradient, parameter and buffer.
void require_golden_tensors(const GoldenCase& c, const Model& model, int64_t steps);

// The golden's own initial state and data, as --init and --data would give them.
void golden_inputs(const TensorFile& golden, TensorFile& init, TensorFile& data);

// Compares a run with a golden file's recorded steps: one report row per golden step tensor. With
// an adaptive optimizer, parameters pass by the update rule (verify/report.h) when the golden's own
// updates are ptool's optimizer on the golden's gradients and, for a parallel run, the run's are
// too (`reference`: the run is ptool's reference, whose updates are its optimizer's by construction).
PlanReport compare_with_golden(const RunRecord& run, const TensorFile& golden, const Tolerance& tol,
                               const std::string& label, const OptimizerSpec& optimizer, bool reference);

// Expands files and folders (every *.safetensors in a folder, sorted) into golden file paths.
std::vector<std::string> golden_paths(const std::vector<std::string>& args);
bool looks_like_golden_arg(const std::string& arg);  // a folder or a .safetensors file

}  // namespace ptool
