#include "core/progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

namespace ptool {

Progress& Progress::get() {
    static Progress p;
    return p;
}

double Progress::elapsed() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
}

void Progress::start(bool live) {
    active_ = true, live_ = live && spdlog::should_log(spdlog::level::info);
    start_ = phase_start_ = Clock::now();
    current_ = "start";
    done_.clear();
}

void Progress::end_phase() {
    const double s = std::chrono::duration<double>(Clock::now() - phase_start_).count();
    done_.emplace_back(current_, s);
    if (line_open_) std::fputs("\n", stderr), line_open_ = false;
    phase_start_ = Clock::now();
}

void Progress::phase(const std::string& name, const std::string& detail) {
    if (!active_) return;
    end_phase();
    current_ = name;
    spdlog::info("[{:7.2f} s] {}{}{}", elapsed(), name, detail.empty() ? "" : ": ", detail);
}

void Progress::step(const std::string& what, int64_t k, int64_t n) {
    if (!active_) return;
    if (live_) {  // one line, rewritten
        fmt::print(stderr, "\r[{:7.2f} s] {} step {}/{}", elapsed(), what, k + 1, n);
        std::fflush(stderr);
        line_open_ = true;
    } else {
        spdlog::debug("[{:7.2f} s] {} step {}/{}", elapsed(), what, k + 1, n);
    }
}

void Progress::finish() {
    if (!active_) return;
    end_phase();
    double sum = 0;
    std::string parts;
    for (const auto& [name, s] : done_)
        sum += s, parts += fmt::format("{}{} {:.2f} s", parts.empty() ? "" : ", ", name, s);
    spdlog::info("phases: {} = {:.2f} s; wall {:.2f} s", parts, sum, elapsed());
    active_ = false;
}

ProgressScope::ProgressScope() {
    Progress::get().start(isatty(fileno(stderr)) != 0);
}

ProgressScope::~ProgressScope() {
    if (std::uncaught_exceptions() == 0)
        Progress::get().finish();
    else
        Progress::get().stop();  // the error is what the command prints
}

void Progress::stop() {
    if (line_open_) std::fputs("\n", stderr), line_open_ = false;
    active_ = false;
}

}  // namespace ptool
