// Checkpoints for --init: a safetensors file, or a sharded one through its index
// (model.safetensors.index.json: {"weight_map": {tensor: "model-00001-of-00002.safetensors"}}),
// and the named key layouts a model's `checkpoint_format` selects (pytorch: the state_dict's own
// names; hf_gpt2: GPT-2's Conv1D checkpoints, docs/hf_import.md).
#pragma once

#include <string>

#include "core/safetensors.h"

namespace ptool {

// A .json path is an index: every shard it names (in its own directory, by plain file name) is
// read and the tensors merged in index order; a tensor in no shard, in a shard the index does not
// name for it, or in two shards is exit 2. Any other path is one safetensors file.
TensorFile read_checkpoint(const std::string& path);

// The formats a model may declare (`checkpoint_format:`), and the conversion of a checkpoint of
// that format into state_dict names and shapes (none for a file already in that layout,
// TensorFile::state_dict_layout: a golden's init.*). Unknown names are InputError.
const std::vector<std::string>& checkpoint_formats();
TensorFile to_state_dict_layout(const std::string& format, const TensorFile& file, const std::string& path);

}  // namespace ptool
