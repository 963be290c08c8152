#include "core/error.h"

namespace ptool {

std::string SourceLocation::str() const {
    if (line <= 0) return file;
    if (column <= 0) return fmt::format("{}:{}", file, line);
    return fmt::format("{}:{}:{}", file, line, column);
}

InputError::InputError(const SourceLocation& where, const std::string& message)
    : std::runtime_error(where.file.empty() ? message : where.str() + ": " + message), where_(where), message_(message) {}

void fail_invariant(const char* cond, const char* file, int line, const std::string& message) {
    throw std::logic_error(fmt::format("internal error at {}:{}: {} ({})", file, line, message, cond));
}

}  // namespace ptool
