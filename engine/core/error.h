// Errors and invariant checks.
//
// Three kinds of failure map to ptool's exit codes (docs/architecture.md):
//   InputError   -> exit 2: bad YAML, plan, file or flag; carries file:line:column when known.
//   RuntimeError -> exit 3: collective timeout, rank failure, CUDA/NCCL error.
//   (exit 1 is not an exception: it is a verdict.)
// A RuntimeError says what kind of failure it is (RuntimeError::Kind): the runners that report a
// rank's failure add "rank R failed: " only to messages that do not already name the rank, and
// they decide that from the kind, never from the message's text.
// PTOOL_REQUIRE is for invariants of the engine itself; it never wraps side effects.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ptool {

struct SourceLocation {
    std::string file;
    int line = 0;    // 1-based; 0 = unknown
    int column = 0;  // 1-based; 0 = unknown

    std::string str() const;
};

// what() is "file:line:column: message" (the message alone where the location is unknown); code
// that needs the parts reads them, never parses what().
class InputError : public std::runtime_error {
public:
    InputError(const SourceLocation& where, const std::string& message);
    explicit InputError(const std::string& message) : std::runtime_error(message), message_(message) {}
    const SourceLocation& where() const { return where_; }   // file "": unknown
    const std::string& message() const { return message_; }  // without the location

private:
    SourceLocation where_;
    std::string message_;
};

class RuntimeError : public std::runtime_error {
public:
    enum class Kind {
        other,        // a resource, a file, a library call: the message does not say which rank
        mismatch,     // ranks disagree: a collective's or a point-to-point pair's descriptors differ
        timeout,      // a collective or a point-to-point op waited past its deadline
        rank_failed,  // a rank failed, ran out of memory or was stopped (the message names it)
        misuse,       // a rank asked for what no peer can match (a send to itself, a peer outside the group)
    };
    explicit RuntimeError(const std::string& message, Kind kind = Kind::other)
        : std::runtime_error(message), kind_(kind) {}
    Kind kind() const { return kind_; }
    // Whether the message already names the rank (or ranks) it is about: every kind but other.
    bool names_rank() const { return kind_ != Kind::other; }

private:
    Kind kind_;
};

// A run's refusal of the action lists it was about to execute because they break the schedule's
// own rules (train/schedule.h check_schedule: a W before its I, a send no receive meets): thrown on
// every rank before anything runs. verify fails the plan with it (the runtime's order is wrong, not
// the plan: exit 1, the violation as its localisation); elsewhere it is an internal error (exit 3).
class ScheduleViolation : public RuntimeError {
public:
    using RuntimeError::RuntimeError;
};

[[noreturn]] void fail_invariant(const char* cond, const char* file, int line, const std::string& message);

}  // namespace ptool

#define PTOOL_REQUIRE(cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) ::ptool::fail_invariant(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
    } while (0)
