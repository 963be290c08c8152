// safetensors files: 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw little-endian data. PyTorch users read them with the `safetensors` package.
//
// Reading validates everything against the file size before touching the data: header length,
// JSON, dtypes, shapes (overflow), offsets in range, contiguous and non-overlapping, byte counts.
// Any violation is InputError naming the file and the tensor. Files are read and written through
// core/files.h (type checks, byte caps, atomic writes).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ptool {

struct TensorFile {
    std::vector<std::pair<std::string, Tensor>> tensors;  // in header order
    std::map<std::string, std::string> metadata;
    // The tensors already carry a model's own state_dict names and shapes (a golden's init.*), so a
    // model's checkpoint_format does not convert them again (model/checkpoint.h). Not in the file.
    bool state_dict_layout = false;

    const Tensor* find(const std::string& name) const;
    void add(std::string name, Tensor t) { tensors.emplace_back(std::move(name), std::move(t)); }
};

TensorFile read_safetensors(const std::string& path);
TensorFile parse_safetensors(const std::string& bytes, const std::string& name);  // for tests and fuzzing
// The __metadata__ of a regular safetensors file, from its header alone: {} when it is no regular
// file or its header does not parse (the full read says why). For checks made before a run reads
// the file (a golden's model_path and plan_path, inputs of its replay).
std::map<std::string, std::string> peek_safetensors_metadata(const std::string& path);

// Writes path as core/files.h's write_file does (atomically; never replacing a non-regular file).
// Refuses to replace an existing file unless overwrite is set.
void write_safetensors(const std::string& path, const TensorFile& file, bool overwrite = true);
std::string serialize_safetensors(const TensorFile& file);

}  // namespace ptool
