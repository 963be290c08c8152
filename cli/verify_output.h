// Printing verify results: the terminal table and summary, the JSON file, and golden replays'
// JUnit XML and JSON.
#pragma once

#include <nlohmann/json.hpp>

#include "verify/golden_replay.h"

namespace ptool::cli {

void print_table(const PlanReport& p, int verbosity);  // tensor, errors, ULP, headroom, replicas, verdict
void print_report(const VerifyReport& report, const std::string& model_path, int verbosity);
void write_json_report(const VerifyReport& report, const std::string& model_path, const std::string& path);
void write_junit(const std::vector<CaseResult>& cases, const std::string& path);
void write_cases_json(const std::vector<CaseResult>& cases, const std::string& path);
std::string format_bytes(int64_t bytes);
// Prints rows as left-aligned columns as wide as their widest cell (the first row is the header).
void print_columns(const std::vector<std::vector<std::string>>& rows, const std::string& indent);
std::string format_counts(const CommCounter& c, int64_t steps);  // "all_reduce x2 (1.2 KiB), ..."
// A rank's memory as JSON: rank, peak_key (measured_peak_bytes or predicted_peak_bytes),
// resident_bytes and the peak's breakdown by use.
nlohmann::json memory_json(const RankMemory& m, const char* peak_key);

}  // namespace ptool::cli
