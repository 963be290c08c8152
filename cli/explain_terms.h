// explain's memory and time, each with the terms that make it up and whether each was measured,
// derived or assumed (docs/planning.md): printed, and as explain --json's `memory[]` and `time[]`
// entries' additions.
#pragma once

#include <nlohmann/json.hpp>

#include "plan/explain_report.h"

namespace ptool::cli {

// The memory table per rank class: allocated (PyTorch's), reserved, on the GPU, the first step's,
// ptool's own run, and the allocated peak by use; then reserved's pools, the runtime and the
// assumptions that err high.
void print_memory(const ExplainReport& r);
// The compute of each rank class term by term (GEMMs, attention, memory-bound, framework ops,
// kernel overhead), after the time table; and where the kernel times come from.
void print_compute_terms(const ExplainReport& r);
// explain --json: a memory entry's framework fields, and a time entry's compute terms.
void add_memory_terms(nlohmann::json& entry, const ExplainReport& r, size_t rank_class);
nlohmann::json compute_terms_json(const ComputeTerms& t);

}  // namespace ptool::cli
