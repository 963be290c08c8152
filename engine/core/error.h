// Errors and invariant checks.
//
// Three kinds of failure map to ptool's exit codes (docs/architecture.md):
//   InputError   -> exit 2: bad YAML, plan, file or flag; carries file:line:column when known.
//   RuntimeError -> exit 3: collective timeout, rank failure, CUDA/NCCL error.
//   (exit 1 is not an exception: it is a verdict.)
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
    const SourceLocation& where() const { return where_; }  // file "": unknown
    const std::string& message() const { return message_; }  // without the location

private:
    SourceLocation where_;
    std::string message_;
};

class RuntimeError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

[[noreturn]] void fail_invariant(const char* cond, const char* file, int line, const std::string& message);

}  // namespace ptool

#define PTOOL_REQUIRE(cond, ...)                                                                \
    do {                                                                                       \
        if (!(cond)) ::ptool::fail_invariant(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
    } while (0)
