// One function per subcommand: it declares the options and sets the callback that calls the
// engine. Parsing and printing only; no maths here.
#pragma once

#include <CLI/CLI.hpp>

namespace ptool::cli {

// Options every command shares (DESIGN §1).
struct Common {
    std::string device = "cpu";
    bool tf32 = false;
    std::string dtype;
    int verbosity = 0;  // -v +1, -q -1
};

void add_run_command(CLI::App& app, Common& common);
void add_verify_command(CLI::App& app, Common& common, int& exit_code);
void add_explain_command(CLI::App& app, Common& common);
void add_golden_command(CLI::App& app, Common& common, int& exit_code);
std::vector<std::string> split_lines(const std::string& s);

}  // namespace ptool::cli
