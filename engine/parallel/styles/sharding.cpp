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

namespace {

// Each rank's piece, in rank order; past 16 ranks as runs of equal pieces ("1 x 16, 0 x 984"):
// torch.chunk's pieces fall in at most three runs, and a thousand ranks' list filled the terminal.
std::string piece_list(int64_t size, int parts) {
    std::vector<int64_t> sizes;
    for (int r = 0; r < parts; ++r) sizes.push_back(chunk_of(size, parts, r).length);
    if (parts <= 16) return fmt::format("{}", fmt::join(sizes, ", "));
    std::vector<std::string> runs;
    for (size_t i = 0; i < sizes.size();) {
        size_t j = i;
        while (j < sizes.size() && sizes[j] == sizes[i]) ++j;
        runs.push_back(fmt::format("{} x {}", sizes[i], j - i));
        i = j;
    }
    return fmt::format("{}", fmt::join(runs, ", "));
}

}  // namespace

void check_sharded_weight(const StyleCheck& c, std::string_view style, int64_t size, const char* what) {
    if (size % c.parts == 0) return;
    c.warnings.push_back({c.where,
                          fmt::format("'{}' {}: {} {} over {} ranks are uneven ({})", c.module.fqn(), style,
                                      size, what, c.parts, piece_list(size, c.parts)),
                          DiagnosticKind::uneven_shard});
}

}  // namespace ptool::styles
