// Progress of a long command on stderr: named phases as they start and end, each with its time,
// a live "step k/n" line when stderr is a terminal, and at the end the phase times, which add up
// to the wall time since the command started (the time before the first phase is "start").
// Levels: off (-q), phases (a terminal, or -v), and nothing when neither. Called from the thread
// that reports (rank 0); a no-op while disabled.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ptool {

class Progress {
public:
    static Progress& get();
    // enabled: print phases; live: rewrite one line per step (stderr is a terminal).
    void configure(bool enabled, bool live);
    bool enabled() const { return enabled_; }
    // Ends the current phase, starts this one: "[  1.23 s] name: detail"; the summary names it by name.
    void phase(const std::string& name, const std::string& detail = "");
    void step(const std::string& what, int64_t k, int64_t n);  // step k (0-based) of n done
    // Ends the current phase and prints every phase's time and their sum against the wall time.
    void finish();

private:
    using Clock = std::chrono::steady_clock;
    void end_phase();
    bool enabled_ = false, live_ = false, line_open_ = false;
    Clock::time_point start_ = Clock::now(), phase_start_ = start_;
    std::string current_ = "start";
    std::vector<std::pair<std::string, double>> done_;
};

// RAII: configures Progress for a command from its verbosity (-q: off; -v: phases; 0: phases when
// stderr is a terminal) and prints the summary when the command ends normally.
struct ProgressScope {
    explicit ProgressScope(int verbosity);
    ~ProgressScope();
};

}  // namespace ptool
