// ptool: plans and verifies parallel training.
//   ptool --help; ptool run models/mlp.yaml --steps 2
// Exit codes: 0 agrees, 1 mismatch, 2 bad input, 3 runtime failure (docs/architecture.md).
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "cli/commands.h"
#include "comm/rank_supervisor.h"
#include "core/error.h"

int main(int argc, char** argv) {
    // A write past a file-size limit (`ulimit -f`) is EFBIG, which the write reports as exit 3
    // naming the file, its temporary removed; SIGXFSZ's default ended the process (exit 153) and
    // left the temporary behind.
    ::signal(SIGXFSZ, SIG_IGN);
    if (std::optional<int> code = ptool::supervise_rank())
        return *code;  // under mpirun: this process only waits
    auto logger = spdlog::stderr_color_mt("ptool");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("%^%l%$: %v");

    CLI::App app{
        "ptool: plan and verify parallel training (data, tensor, 2-D) against a single-device reference"};
    app.add_flag_callback(
        "--version", [] { throw CLI::CallForVersion(ptool::cli::version_text(), 0); },
        "print the version and what this build can use (CUDA, cuBLAS, NCCL, MPI, OpenBLAS)");
    app.require_subcommand(1);
    app.fallthrough();  // -v/-q also after the subcommand
    ptool::cli::Common common;
    // spdlog's level follows: -q warnings and errors only, default info (verify's phases), -v debug
    // (a line per step where stderr is no terminal)
    auto level = [&] {
        spdlog::set_level(common.verbosity < 0   ? spdlog::level::warn
                          : common.verbosity > 0 ? spdlog::level::debug
                                                 : spdlog::level::info);
    };
    app.add_flag_function(
        "-v,--verbose", [&](int64_t n) { common.verbosity += static_cast<int>(n), level(); },
        "more output (repeatable)");
    app.add_flag_function(
        "-q,--quiet", [&](int64_t n) { common.verbosity -= static_cast<int>(n), level(); }, "less output");
    int exit_code = 0;
    ptool::cli::add_run_command(app, common);
    ptool::cli::add_verify_command(app, common, exit_code);
    ptool::cli::add_explain_command(app, common);
    ptool::cli::add_plan_command(app, common, exit_code);
    ptool::cli::add_shrink_command(app);
    ptool::cli::add_import_command(app);
    ptool::cli::add_golden_command(app, common, exit_code);
    ptool::cli::add_calibrate_command(app, common);
    ptool::cli::refuse_empty_values(app);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);  // --help and --version print here: they must arrive too
        std::cout.flush();
        if (code == 0 && (std::cout.fail() || std::fflush(stdout) != 0 || std::ferror(stdout))) {
            spdlog::error("cannot write to standard output: {}", std::strerror(errno));
            return 3;
        }
        return code == 0 ? 0 : 2;
    } catch (const ptool::InputError& e) {
        spdlog::error("{}", e.what());
        return 2;
    } catch (const ptool::RuntimeError& e) {
        spdlog::error("{}", e.what());
        return 3;
    } catch (const std::bad_alloc&) {
        spdlog::error(
            "out of memory: an allocation failed (a smaller model, fewer ranks or steps, or more memory)");
        return 3;
    } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return 3;
    }
    // what was printed must have arrived: a full disk or a closed pipe on stdout is a failure
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        spdlog::error("cannot write to standard output: {}", std::strerror(errno));
        return 3;
    }
    return exit_code;
}
