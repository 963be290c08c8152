#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

namespace ptool {

Progress& Progress::get() {
    static Progress p;
    return p;
}

void Progress::configure(bool enabled, bool live) {
    enabled_ = enabled, live_ = live && enabled;
    start_ = phase_start_ = Clock::now();
    current_ = "start";
    done_.clear();
}

void Progress::end_phase() {
    const double s = std::chrono::duration<double>(Clock::now() - phase_start_).count();
    done_.emplace_back(current_, s);
    if (line_open_) std::fputs("\n", stderr), line_open_ = false;
    if (enabled_ && current_ != "start") fmt::print(stderr, "  {} done in {:.2f} s\n", current_, s);
    phase_start_ = Clock::now();
}

void Progress::phase(const std::string& name, const std::string& detail) {
    if (!enabled_) return;
    end_phase();
    current_ = name;
    fmt::print(stderr, "[{:7.2f} s] {}{}{}\n", std::chrono::duration<double>(Clock::now() - start_).count(), name,
               detail.empty() ? "" : ": ", detail);
    std::fflush(stderr);
}

void Progress::step(const std::string& what, int64_t k, int64_t n) {
    if (!enabled_) return;
    const double t = std::chrono::duration<double>(Clock::now() - start_).count();
    if (live_) {
        fmt::print(stderr, "\r[{:7.2f} s] {} step {}/{}", t, what, k + 1, n);
        line_open_ = true;
    } else {
        fmt::print(stderr, "[{:7.2f} s] {} step {}/{}\n", t, what, k + 1, n);
    }
    std::fflush(stderr);
}

void Progress::finish() {
    if (!enabled_) return;
    end_phase();
    double sum = 0;
    std::string parts;
    for (const auto& [name, s] : done_) sum += s, parts += fmt::format("{}{} {:.2f} s", parts.empty() ? "" : ", ", name, s);
    fmt::print(stderr, "phases: {} = {:.2f} s; wall {:.2f} s\n", parts, sum,
               std::chrono::duration<double>(Clock::now() - start_).count());
    enabled_ = false;
}

ProgressScope::ProgressScope(int verbosity) {
    const bool terminal = isatty(fileno(stderr)) != 0;
    Progress::get().configure(verbosity > 0 || (verbosity == 0 && terminal), terminal);
}

ProgressScope::~ProgressScope() {
    if (std::uncaught_exceptions() == 0) Progress::get().finish();
    else Progress::get().configure(false, false);
}

}  // namespace ptool
