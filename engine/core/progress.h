// Progress of a long command on stderr, through spdlog: named phases as they start (info), with
// the time since the command started; a "step k/n" line per step (rewritten in place when stderr is a
// terminal; else at debug level, -v); at the end the phase times, which add up to the wall time
// since the command started (the time before the first phase is "start"). spdlog's level is
// the command line's (-q: warnings only, so none of this). Called from the thread that reports
// (rank 0).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ptool {

class Progress {
public:
    static Progress& get();
    void start(bool live);  // live: stderr is a terminal
    // Ends the current phase, starts this one: "[  1.23 s] name: detail"; the summary names it by name.
    void phase(const std::string& name, const std::string& detail = "");
    void step(const std::string& what, int64_t k, int64_t n);  // step k (0-based) of n done
    // Ends the current phase and prints every phase's time and their sum against the wall time.
    void finish();
    void stop();  // ends without a summary (the command failed)

private:
    using Clock = std::chrono::steady_clock;
    void end_phase();
    double elapsed() const;
    bool active_ = false, live_ = false, line_open_ = false;
    Clock::time_point start_ = Clock::now(), phase_start_ = start_;
    std::string current_ = "start";
    std::vector<std::pair<std::string, double>> done_;
};

// RAII over a command: starts Progress (live when stderr is a terminal) and prints the summary
// when the command ends normally.
struct ProgressScope {
    ProgressScope();
    ~ProgressScope();
};

}  // namespace ptool
