// replicate: Hugging Face's ReplicateParallel (transformers' tensor_parallel "replicate"): a module
// that runs whole on every rank of the tensor-parallel dim, its parameters distributed as
// Replicate (src_data_rank's broadcast) and its input required to be Replicate. It is how a plan
// says "this module is not parallel" inside a TP region, and the lint then checks the claim.
// docs/adding_a_style.md walks through this file.
#include "parallel/style.h"

namespace ptool::styles {
namespace {

class Replicate final : public Style {
public:
    std::string_view name() const override { return style_name::replicate; }
    bool applies_to(const Module&) const override { return true; }
    std::string_view applies_to_text() const override { return "any module"; }
    void parse(YamlMap& m, const YamlNode&, StyleSpec& s) const override {
        s.use_local_output = m.bool_or("use_local_output", true);
    }
    std::vector<ParamPlacement> params(const Module& m) const override {
        std::vector<ParamPlacement> out;
        for (const auto& e : m.params()) out.push_back({e.name, Placement::replicate()});
        return out;
    }
    StyleRule rule(const Module&, const StyleSpec&) const override {
        StyleRule r;
        r.pre = Redistribution{Placement::replicate(),
                               Placement::replicate()};  // declares Replicate; moves nothing
        return r;
    }
};

PTOOL_REGISTER_STYLE(Replicate);

}  // namespace
}  // namespace ptool::styles
