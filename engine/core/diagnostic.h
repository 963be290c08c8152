// A finding at a place in an input file that is not an error: a lint warning (a pattern that
// matches no module, uneven shards) or the cause of an expected mismatch (loss: sum under data
// parallel). Its location and message are data, as an InputError's (core/error.h); str() is how
// it prints, and code that needs the message reads it rather than parsing str().
#pragma once

#include <string>
#include <vector>

#include "core/error.h"

namespace ptool {

// What a diagnostic says, for code that acts on it (the planner, tests): code reads the kind,
// never the message's words.
enum class DiagnosticKind {
    other,
    unmatched_pattern,    // a plan's pattern (tensor_parallel, fully_shard, checkpointing) matched no module
    uneven_shard,         // a dim split over ranks into unequal chunks (heads, features, vocab, sequence)
    empty_plan,           // a section that parallelizes nothing
    unreduced_gradients,  // a module's replicated parameters get gradients of only its rank's rows
    no_effect,            // an option that changes nothing where it is given
};

struct Diagnostic {
    SourceLocation where;  // file "": none
    std::string message;
    DiagnosticKind kind = DiagnosticKind::other;

    // "file:line:column: message" (the message alone without a file), as InputError's what().
    std::string str() const { return where.file.empty() ? message : where.str() + ": " + message; }
};

inline std::vector<std::string> diagnostic_strings(const std::vector<Diagnostic>& ds) {
    std::vector<std::string> out;
    for (const Diagnostic& d : ds) out.push_back(d.str());
    return out;
}

}  // namespace ptool
