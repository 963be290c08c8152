#include "parallel/styles/sharding.h"

#include "core/tensor_ops.h"

namespace ptool::styles {

const Linear* as_linear(const Module& m) {
    return dynamic_cast<const Linear*>(&m);
}
const Embedding* as_embedding(const Module& m) {
    return dynamic_cast<const Embedding*>(&m);
}
bool linear_or_embedding(const Module& m) {
    return as_linear(m) || as_embedding(m);
}

void ShardingStyle::parse(YamlMap& m, const YamlNode&, StyleSpec& s) const {
    s.input_layouts = parse_layout_key(m, "input_layouts");
    s.output_layouts = parse_layout_key(m, "output_layouts");
    s.use_local_output = m.bool_or("use_local_output", true);
}

void check_sharded_weight(const StyleCheck& c, std::string_view style, int64_t size, const char* what) {
    if (size % c.parts == 0) return;
    std::vector<int64_t> sizes;
    for (int r = 0; r < c.parts; ++r) sizes.push_back(chunk_of(size, c.parts, r).length);
    c.warnings.push_back({c.where,
                          fmt::format("'{}' {}: {} {} over {} ranks are uneven ({})", c.module.fqn(), style,
                                      size, what, c.parts, fmt::join(sizes, ", ")),
                          DiagnosticKind::uneven_shard});
}

}  // namespace ptool::styles
