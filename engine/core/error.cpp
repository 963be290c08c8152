#include "core/error.h"

#include <string_view>

#include "core/check.h"

namespace ptool {

std::string SourceLocation::str() const {
    if (line <= 0) return file;
    if (column <= 0) return fmt::format("{}:{}", file, line);
    return fmt::format("{}:{}:{}", file, line, column);
}

InputError::InputError(const SourceLocation& where, const std::string& message)
    : std::runtime_error(where.file.empty() ? message : where.str() + ": " + message),
      where_(where),
      message_(message) {}

void fail_invariant(const char* cond, const char* file, int line, const std::string& message) {
    throw std::logic_error(fmt::format("internal error at {}:{}: {} ({})", file, line, message, cond));
}

std::string check_failure_message(const char* stmt, const char* file, int line, const std::string& error) {
    std::string_view where(file);  // the build's relative path ("../../engine/..."): from the source root
    while (where.starts_with("../") || where.starts_with("./")) where.remove_prefix(where.find('/') + 1);
    return fmt::format("{} failed at {}:{}: {}", stmt, where, line, error);
}

void throw_check_failure(const std::string& message) {
    throw RuntimeError(message);
}

}  // namespace ptool
