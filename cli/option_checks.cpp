// The checks of flags that take numbers or name files to write. CLI11 reads "2abc" as bad but
// "010" as octal 8, "0x10" as 16 and "nan" or "1e300" as numbers that pass PositiveNumber; every
// numeric flag is instead the whole text, a whole number or a finite real in its range (core/
// numbers.h), normalised to plain decimal before CLI11 converts it. An output flag given "" (e.g.
// `--csv ""` from an unset shell variable) is refused rather than silently writing nothing, and so
// is every other option given "" (`--golden ""` compared with nothing and passed).
#include <cmath>

#include "cli/commands.h"
#include "core/error.h"
#include "core/numbers.h"

namespace ptool::cli {

CLI::Validator whole_number(int64_t lo, int64_t hi) {
    return CLI::Validator(
        [lo, hi](std::string& text) -> std::string {
            const std::string why = check_int_text(text, lo, hi);
            if (why.empty())
                text = std::to_string(*parse_whole_int(text));  // CLI11 would read "010" as octal
            return why;
        },
        fmt::format("INT in [{}, {}]", lo, hi));
}

CLI::Validator finite_number(double lo, double hi, bool lo_open) {
    return CLI::Validator(
        [lo, hi, lo_open](std::string& text) -> std::string {
            return check_real_text(text, lo, hi, lo_open);
        },
        fmt::format("NUMBER in {}{:g}, {:g}]", lo_open ? "(" : "[", lo, hi));
}

const CLI::Validator& finite_non_negative() {
    static const CLI::Validator v = finite_number(0, 1e300, false);
    return v;
}

void refuse_empty_values(CLI::App& app) {
    static const CLI::Validator non_empty(
        [](std::string& text) -> std::string {
            return text.empty() ? std::string(
                                      "an empty value (an unset shell variable?): give one, or leave "
                                      "the option out")
                                : "";
        },
        "");
    for (CLI::Option* o : app.get_options([](CLI::Option* o) { return o->get_type_size() != 0; }))
        o->check(non_empty);
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_values(*sub);
}

const CLI::Validator& output_path() {
    static const CLI::Validator v(
        [](std::string& text) -> std::string {
            return text.empty() ? std::string("an empty file name: name a file to write") : "";
        },
        "FILE");
    return v;
}

}  // namespace ptool::cli
