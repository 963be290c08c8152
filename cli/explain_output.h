// Printing `ptool explain`'s report (plan/explain_report.h): the terminal text section by section
// (cli/explain_text.cpp) and the --json document (cli/explain_json.cpp); the memory and time terms
// of both in cli/explain_terms.h.
#pragma once

#include <nlohmann/json.hpp>

#include "plan/explain_report.h"

namespace ptool::cli {

void print_explain(const ExplainReport& r, const std::string& model_path, const std::string& plan_path);
nlohmann::json explain_json(const ExplainReport& r, const std::string& model_path,
                            const std::string& plan_path);
// Ranks as ascending ranges: "0-3, 8-11" (the rank classes of explain's tables)
std::string rank_ranges(const std::vector<int>& ranks);

}  // namespace ptool::cli
