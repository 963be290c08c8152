// What the two parameter-sharding styles (colwise, rowwise) share on linears and embeddings.
#pragma once

#include "parallel/style.h"

namespace ptool::styles {

const Linear* as_linear(const Module& m);
const Embedding* as_embedding(const Module& m);
bool linear_or_embedding(const Module& m);

// A style that shards a linear's or an embedding's weight: the modules it applies to and its
// options (input_layouts, output_layouts, use_local_output) are the same for both.
class ShardingStyle : public Style {
public:
    bool applies_to(const Module& m) const override { return linear_or_embedding(m); }
    std::string_view applies_to_text() const override { return "linear and embedding modules"; }
    void parse(YamlMap& m, const YamlNode& node, StyleSpec& s) const override;
};

// A dim that does not split evenly over the ranks is a warning naming the chunk sizes (torch.chunk).
// (A tied weight is checked across its modules by resolve_plan.)
void check_sharded_weight(const StyleCheck& c, std::string_view style, int64_t size, const char* what);

}  // namespace ptool::styles
