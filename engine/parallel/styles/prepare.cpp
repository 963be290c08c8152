// prepare_input, prepare_output, prepare_input_output: PyTorch's PrepareModuleInput,
// PrepareModuleOutput and PrepareModuleInputOutput. They shard nothing; they redistribute the
// module's input from input_layouts to desired_input_layouts and its output from output_layouts
// to desired_output_layouts (the gradients the other way), on any module.
#include "parallel/style.h"

namespace ptool::styles {
namespace {

class Prepare final : public Style {
public:
    Prepare(std::string_view name, bool in, bool out) : name_(name), in_(in), out_(out) {}
    std::string_view name() const override { return name_; }
    bool applies_to(const Module&) const override { return true; }
    std::string_view applies_to_text() const override { return "any module"; }

    void parse(YamlMap& m, const YamlNode& node, StyleSpec& s) const override {
        if (in_) {
            s.input_layouts = parse_layout_key(m, "input_layouts");
            s.desired_input_layouts = parse_layout_key(m, "desired_input_layouts");
            if (!s.input_layouts || !s.desired_input_layouts)
                node.fail(fmt::format("{} needs input_layouts and desired_input_layouts", name_));
        }
        if (out_) {
            s.output_layouts = parse_layout_key(m, "output_layouts");
            s.desired_output_layouts = parse_layout_key(m, "desired_output_layouts");
            if (!s.output_layouts || !s.desired_output_layouts)
                node.fail(fmt::format("{} needs output_layouts and desired_output_layouts", name_));
        }
        s.use_local_output = m.bool_or("use_local_output", true);
    }

    StyleRule rule(const Module&, const StyleSpec& s) const override {
        StyleRule r;
        if (in_) r.pre = Redistribution{*s.input_layouts, *s.desired_input_layouts};
        if (out_) r.post = Redistribution{*s.output_layouts, *s.desired_output_layouts};
        return r;
    }

private:
    std::string_view name_;
    bool in_, out_;
};

const bool registered =
    register_style(std::make_unique<Prepare>(style_name::prepare_input, true, false)) &&
    register_style(std::make_unique<Prepare>(style_name::prepare_output, false, true)) &&
    register_style(std::make_unique<Prepare>(style_name::prepare_input_output, true, true));

}  // namespace
}  // namespace ptool::styles
