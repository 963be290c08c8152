// Printing verify results: the terminal table and summary, the JSON file, and golden replays'
// JUnit XML and JSON.
#pragma once

#include <nlohmann/json.hpp>

#include "verify/golden_replay.h"

namespace ptool::cli {

void print_table(const PlanReport& p, int verbosity);  // tensor, errors, ULP, headroom, replicas, verdict
void print_report(const VerifyReport& report, const std::string& model_path, int verbosity);
void write_json_report(const VerifyReport& report, const std::string& model_path, const std::string& path);
// JUnit XML (cli/junit.cpp): golden replays, a testcase per case; a model + plan verify, a
// testsuite per plan with a testcase for the plan and one per failing tensor.
void write_junit(const std::vector<CaseResult>& cases, const std::string& path);
void write_junit_report(const VerifyReport& report, const std::string& model_path, const std::string& path);
// cli/report_html.cpp: verify --report (self-contained HTML) and --csv (the heat map's numbers).
void write_html_report(const VerifyReport& report, const std::string& model_path, const std::string& path);
void write_csv_report(const VerifyReport& report, const std::string& path);
std::string markup_escape(const std::string& s);  // & < > " as HTML/XML entities
std::string markup_number(
    double v);  // the HTML and JUnit reports' numbers: 3 significant digits, "inf" if not finite
std::string whole_phrases(const std::string& text, size_t limit);  // cut at the last "; " before limit
void write_cases_json(const std::vector<CaseResult>& cases, const std::string& path);
std::string format_bytes(int64_t bytes);
// Prints rows as left-aligned columns as wide as their widest cell (the first row is the header).
void print_columns(const std::vector<std::vector<std::string>>& rows, const std::string& indent);
std::string format_counts(const CommCounter& c, int64_t steps);  // "all_reduce x2 (1.2 KiB), ..."
// A rank's memory as JSON: rank, peak_key (measured_peak_bytes or predicted_peak_bytes),
// resident_bytes and the peak's breakdown by use.
nlohmann::json memory_json(const RankMemory& m, const char* peak_key);

// Every --json document starts with these: schema_version (docs/schema/: bumped when a field
// changes meaning or goes away; new fields keep it), kind ("verify", "golden_cases", "explain",
// "plan") and the ptool version that wrote it.
constexpr int kJsonSchemaVersion = 1;
nlohmann::json json_document(const char* kind);
// A recorded tensor's structured identity: {"step": 0, "kind": "grad", "fqn": "net1.weight"}
// (kinds output, loss, grad_norm without fqn; grad, param, buffer with it).
nlohmann::json tensor_id(const std::string& golden_name);

}  // namespace ptool::cli
