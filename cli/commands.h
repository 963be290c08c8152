// One function per subcommand: it declares the options and sets the callback that calls the
// engine. Parsing and printing only; no maths here.
#pragma once

#include <CLI/CLI.hpp>

#include "core/device_memory.h"

namespace ptool {
struct Fault;
}

namespace ptool::cli {

// Options every command shares.
struct Common {
    std::string device = "cpu";
    bool tf32 = false;
    std::string dtype;
    int verbosity = 0;  // -v +1, -q -1
};

void add_run_command(CLI::App& app, Common& common);
std::string version_text();  // ptool --version
void add_verify_command(CLI::App& app, Common& common, int& exit_code);
void add_explain_command(CLI::App& app, Common& common);
void add_plan_command(CLI::App& app, Common& common, int& exit_code);
void add_shrink_command(CLI::App& app);
void add_import_command(CLI::App& app);  // import hf, import hf-tp-plan
// shrink_model (plan/shrink.h) of the model file for the plan file, linted with the plan.
std::string shrunk_model_checked(const std::string& model_path, const std::string& plan_path);
void add_golden_command(CLI::App& app, Common& common, int& exit_code);
void add_calibrate_command(CLI::App& app, Common& common);  // cli/calibrate_command.cpp
std::vector<std::string> split_lines(const std::string& s);
void add_device_options(CLI::App* cmd, Common& common);  // --device cpu|cuda, --tf32
// cli/option_checks.cpp: numeric flags are their whole text, in range; output files are named
const CLI::Validator& finite_non_negative();          // --rtol, --atol: NaN and negatives are bad input
CLI::Validator whole_number(int64_t lo, int64_t hi);  // --steps, --world-size, --batch ...
CLI::Validator finite_number(double lo, double hi, bool lo_open);  // --timeout, --memory-cap
const CLI::Validator& output_path();                               // --json, -o ...: not ""
// Every option of `app` and its subcommands that takes a value refuses "" (exit 2 naming it): an
// unset variable in `--golden "$G"` compared with nothing and passed.
void refuse_empty_values(CLI::App& app);
ptool::Device select_device(const Common& common);  // configures the backends, returns the device
ptool::Fault fault_from_environment();              // cli/fault_env.cpp: PTOOL_FAULT, parsed (exit 2 if bad)

}  // namespace ptool::cli
