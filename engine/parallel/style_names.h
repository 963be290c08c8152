// The plan vocabulary's style names, spelled once: each style object's name() is its constant
// here, and the code that writes plans (plan/plan_writer.cpp, import/hf_tp_plan.cpp) writes its
// entries with them, so a renamed style cannot leave a writer emitting the old name.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace ptool::style_name {

inline constexpr std::string_view colwise = "colwise";
inline constexpr std::string_view rowwise = "rowwise";
inline constexpr std::string_view sequence_parallel = "sequence_parallel";
inline constexpr std::string_view replicate = "replicate";
inline constexpr std::string_view prepare_input = "prepare_input";
inline constexpr std::string_view prepare_output = "prepare_output";
inline constexpr std::string_view prepare_input_output = "prepare_input_output";

// A plan entry's value: the style's name alone, or "{style: NAME, OPTIONS}" when it has options.
inline std::string entry(std::string_view style, std::string_view options = {}) {
    return options.empty() ? std::string(style) : fmt::format("{{style: {}, {}}}", style, options);
}

}  // namespace ptool::style_name
