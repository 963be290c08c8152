// Printing `ptool explain`'s report (plan/explain_report.h): the terminal text section by section
// (cli/explain_text.cpp) and the --json document (cli/explain_json.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include "plan/explain_report.h"

namespace ptool::cli {

void print_explain(const ExplainReport& r, const std::string& model_path, const std::string& plan_path);
nlohmann::json explain_json(const ExplainReport& r, const std::string& model_path,
                            const std::string& plan_path);

}  // namespace ptool::cli
