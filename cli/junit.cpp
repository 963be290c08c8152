// JUnit XML for CI: golden replays (a testcase per case) and model + plan verifies (a testcase per
// plan and one per failing tensor). Messages are whole phrases: a long one is cut at the last
// "; " before the limit, never inside a word or number.
#include <cmath>

#include "cli/verify_output.h"
#include "core/files.h"

namespace ptool::cli {
namespace {

// XML's five escapes; other control characters (invalid in XML 1.0) become spaces.
std::string xml_escape(const std::string& s) {
    std::string o;
    for (char c : markup_escape(s))
        o += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? ' ' : c;
    return o;
}

bool failed(const CaseResult& c) {
    return c.verdict == Verdict::fail || c.verdict == Verdict::stale || c.verdict == Verdict::refused;
}

const char* failure_type(Verdict v) {
    return v == Verdict::stale ? "stale" : v == Verdict::refused ? "refused" : "mismatch";
}

std::string testcase(const std::string& classname, const std::string& name, double seconds,
                     const std::string& failure_type, const std::string& message, const std::string& body) {
    std::string x = fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\"",
                                xml_escape(classname), xml_escape(name), seconds);
    if (failure_type.empty()) return x + "/>\n";
    return x + fmt::format(">\n      <failure type=\"{}\" message=\"{}\">{}</failure>\n    </testcase>\n",
                           failure_type, xml_escape(message), xml_escape(body));
}

std::string document(int tests, int failures, double seconds, const std::string& suites) {
    return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" +
           fmt::format(
               "<testsuites name=\"ptool verify\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
               "time=\"{:.3f}\">\n",
               tests, failures, seconds) +
           suites + "</testsuites>\n";
}

std::string suite(const std::string& name, int tests, int failures, double seconds,
                  const std::string& cases) {
    return fmt::format(
               "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\" "
               "time=\"{:.3f}\">\n",
               xml_escape(name), tests, failures, seconds) +
           cases + "  </testsuite>\n";
}

}  // namespace

std::string whole_phrases(const std::string& text, size_t limit) {
    if (text.size() <= limit) return text;
    const size_t cut = text.rfind("; ", limit);
    if (cut != std::string::npos && cut > 0) return text.substr(0, cut) + "; ...";
    const size_t space = text.rfind(' ', limit);
    return (space != std::string::npos && space > 0 ? text.substr(0, space) : text.substr(0, limit)) + " ...";
}

void write_junit(const std::vector<CaseResult>& cases, const std::string& path) {
    int failures = 0;
    double total = 0;
    std::string body;
    for (const auto& c : cases) {
        failures += failed(c), total += c.seconds;
        body +=
            testcase("ptool.golden", c.path, c.seconds, failed(c) ? failure_type(c.verdict) : "",
                     whole_phrases(std::string(verdict_name(c.verdict)) + ": " + c.detail, 300), c.detail);
    }
    const int n = static_cast<int>(cases.size());
    write_file(path, document(n, failures, total, suite("golden", n, failures, total, body)), true);
}

void write_junit_report(const VerifyReport& report, const std::string& model_path, const std::string& path) {
    int tests = 0, failures = 0;
    double total = report.reference_seconds;
    std::string suites;
    for (const PlanReport& p : report.plans) {
        std::string cases, why = p.localisation;
        if (why.empty())
            for (const std::string& n : p.notes)
                if (n.rfind("FAIL", 0) == 0) why = n;
        int t = 1, f = !p.pass;
        cases += testcase(
            "ptool.verify", p.plan_path, p.run.seconds, p.pass ? "" : "verify",
            whole_phrases(
                p.pass ? "" : fmt::format("FAIL {}/{} tensors agree; {}", p.passed, p.passed + p.failed, why),
                300),
            fmt::format("ptool verify {} {}: {} ranks ({})\n{}\n{}", model_path, p.plan_path,
                        p.run.world_size, p.run.backend, why, fmt::join(p.notes, "\n")));
        for (const TensorReport& r : p.tensors) {
            if (r.pass) continue;
            ++t, ++f;
            const std::string what =
                !r.diff.shape_ok ? std::string("missing or of another shape")
                : replica_failure(r.replicas)
                    ? fmt::format("replicas {}", replica_state_name(r.replicas))
                    : fmt::format("max abs {} max rel {} headroom {} (ULP {})", markup_number(r.diff.max_abs),
                                  markup_number(r.diff.max_rel), markup_number(r.diff.headroom),
                                  r.diff.max_ulp);
            cases +=
                testcase("ptool.verify." + p.plan_path, r.name, 0, "mismatch", what,
                         fmt::format("{}: {}; rtol {:g} atol {:g}", r.name, what, p.tol.rtol, p.tol.atol));
        }
        tests += t, failures += f, total += p.run.seconds;
        suites += suite(p.plan_path, t, f, p.run.seconds, cases);
    }
    write_file(path, document(tests, failures, total, suites), true);
}

}  // namespace ptool::cli
