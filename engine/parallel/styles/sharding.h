// What the two parameter-sharding styles (colwise, rowwise) share on linears and embeddings.
#pragma once

#include "parallel/style.h"

namespace ptool::styles {

const Linear* as_linear(const Module& m);
const Embedding* as_embedding(const Module& m);
bool linear_or_embedding(const Module& m);

// input_layouts, output_layouts, use_local_output.
void parse_io_layouts(YamlMap& m, StyleSpec& s);

// A weight reachable under two names (tied) is refused; a dim that does not split evenly over the
// ranks is a warning naming the chunk sizes (torch.chunk).
void check_sharded_weight(const StyleCheck& c, std::string_view style, int64_t size, const char* what);

}  // namespace ptool::styles
