#include "cli/golden_replay.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/verify_output.h"
#include "model/batch.h"

namespace ptool::cli {
namespace {

// The golden's own initial state and data, as --init and --data would give them.
void golden_inputs(const TensorFile& g, TensorFile& init, TensorFile& data) {
    for (const auto& [name, t] : g.tensors) {
        if (name.rfind("init.param.", 0) == 0) init.add(name.substr(11), t);
        else if (name.rfind("init.buffer.", 0) == 0) init.add(name.substr(12), t);
        else if (name == "data.input" || name == "data.target") data.add(name.substr(5), t);
        else if (auto key = parse_step_key(name); key && (key->rest == "input" || key->rest == "target"))
            data.add(name, t);
    }
}

std::string worst(const PlanReport& r, size_t n) {
    std::vector<const TensorReport*> bad;
    for (const auto& t : r.tensors)
        if (!t.pass) bad.push_back(&t);
    std::sort(bad.begin(), bad.end(), [](auto* a, auto* b) { return a->diff.headroom > b->diff.headroom; });
    std::vector<std::string> parts;
    for (size_t i = 0; i < bad.size() && i < n; ++i)
        parts.push_back(bad[i]->diff.shape_ok ? fmt::format("{} (max abs {:.3g}, headroom {:.3g})", bad[i]->name,
                                                            bad[i]->diff.max_abs, bad[i]->diff.headroom)
                                              : fmt::format("{} (missing or shape differs)", bad[i]->name));
    return fmt::format("{}", fmt::join(parts, "; "));
}

std::string xml_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        switch (c) {
            case '&': o += "&amp;"; break;
            case '<': o += "&lt;"; break;
            case '>': o += "&gt;"; break;
            case '"': o += "&quot;"; break;
            default: o += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? ' ' : c;
        }
    }
    return o;
}

}  // namespace

CaseResult replay_case(const GoldenCase& c, const VerifyInputs& base, const Plan& plan, const GoldenOptions& opt,
                       const Common& common) {
    const auto t0 = std::chrono::steady_clock::now();
    CaseResult res;
    res.path = c.path;
    TensorFile init, data;
    golden_inputs(c.file, init, data);
    VerifyInputs in = base;
    in.init = &init, in.init_path = c.path + "[init.*]";
    in.data = &data, in.data_path = c.path + "[data]";
    in.golden = &c.file;  // the parallel run is compared with it as it records
    VerifyOptions vo = opt.verify;
    auto md = [&](const char* k) { return c.file.metadata.count(k) ? c.file.metadata.at(k) : std::string(); };
    if (!vo.steps && !md("steps").empty()) vo.steps = std::stoll(md("steps"));
    if (!vo.rtol && !md("rtol").empty()) vo.rtol = std::stod(md("rtol"));
    if (!vo.atol && !md("atol").empty()) vo.atol = std::stod(md("atol"));
    VerifyReport vr = verify_in_process(in, {plan}, vo);
    const Tolerance tol = vr.plans[0].tol;
    res.directions.push_back(vr.plans[0]);
    res.directions.push_back(compare_with_golden(vr.reference, c.file, tol, "reference vs golden"));
    res.directions.push_back(compare_with_golden(vr.plans[0].run, c.file, tol, "parallel vs golden"));
    res.directions[0].plan_path = "parallel vs reference";
    const bool pass = std::all_of(res.directions.begin(), res.directions.end(), [](auto& d) { return d.pass; });
    res.verdict = pass ? "PASS" : "FAIL";
    if (!c.stale.empty()) res.verdict = "STALE", res.detail = c.stale;
    if (res.verdict == "FAIL") {
        for (const auto& d : res.directions)
            if (!d.pass) res.detail += fmt::format("{}{}: {}", res.detail.empty() ? "" : "; ", d.plan_path, worst(d, 3));
        if (!res.directions[0].localisation.empty()) res.detail += "; " + res.directions[0].localisation;
    }
    if (res.verdict == "FAIL" && opt.update && !res.directions[1].pass) {  // the numbers moved: re-record, loudly
        TensorFile fresh = record_golden(in, plan, vo);
        fresh.metadata = c.file.metadata;
        write_safetensors(c.path, fresh, true);
        fmt::print("updated {}: moved: {}\n", c.path, worst(res.directions[1], 5));
        res.verdict = "UPDATED";
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

int verify_golden_files(const std::vector<std::string>& args, const GoldenOptions& opt, const Common& common) {
    std::vector<CaseResult> results;
    const Device device = select_device(common);  // --device cuda: CPU-recorded goldens replayed on the GPU
    for (const std::string& path : golden_paths(args)) {
        GoldenCase c = load_golden(path);
        VerifyInputs in;
        in.model_path = c.path + "[model_yaml]";
        in.model_text = c.model_yaml;
        in.dtype_override = common.dtype;
        in.device = device;
        load_model_text(in.model_text, in.model_path, common.dtype, false);  // a model that no longer parses: exit 2
        const Plan plan = load_plan_text(c.plan_yaml, c.path + "[plan_yaml]");
        CaseResult r = replay_case(c, in, plan, opt, common);
        fmt::print("{}: {} ({} ranks, {:.0f} ms){}{}\n", r.path, r.verdict, plan.world_size(), r.seconds * 1e3,
                   r.detail.empty() ? "" : " · ", r.detail);
        results.push_back(std::move(r));
    }
    int passed = 0, failed = 0, stale = 0, updated = 0;
    for (const auto& r : results) {
        passed += r.verdict == "PASS";
        failed += r.verdict == "FAIL";
        stale += r.verdict == "STALE";
        updated += r.verdict == "UPDATED";
    }
    fmt::print("golden: {} cases: {} passed, {} failed, {} stale, {} updated\n", results.size(), passed, failed, stale,
               updated);
    if (!opt.junit.empty()) write_junit(results, opt.junit);
    if (!opt.json.empty()) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& r : results) {
            nlohmann::json jc{{"file", r.path}, {"verdict", r.verdict}, {"detail", r.detail}, {"seconds", r.seconds}};
            for (const auto& d : r.directions) {
                nlohmann::json jd{{"pass", d.pass}, {"passed", d.passed}, {"failed", d.failed}};
                for (const auto& t : d.tensors)
                    if (!t.pass) jd["failures"].push_back({{"name", t.name}, {"max_abs", t.diff.max_abs}});
                jc["directions"][d.plan_path] = jd;
            }
            j.push_back(jc);
        }
        write_file_atomic(opt.json, nlohmann::json{{"cases", j}}.dump(2) + "\n", true);
    }
    return failed + stale == 0 ? 0 : 1;
}

void write_junit(const std::vector<CaseResult>& cases, const std::string& path) {
    int failures = 0;
    double total = 0;
    for (const auto& c : cases) failures += c.verdict == "FAIL" || c.verdict == "STALE", total += c.seconds;
    std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    x += fmt::format("<testsuites name=\"ptool verify\" tests=\"{}\" failures=\"{}\" errors=\"0\" time=\"{:.3f}\">\n",
                     cases.size(), failures, total);
    x += fmt::format("  <testsuite name=\"golden\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\" time=\"{:.3f}\">\n",
                     cases.size(), failures, total);
    for (const auto& c : cases) {
        x += fmt::format("    <testcase classname=\"ptool.golden\" name=\"{}\" time=\"{:.3f}\"", xml_escape(c.path), c.seconds);
        if (c.verdict == "FAIL" || c.verdict == "STALE")
            x += fmt::format(">\n      <failure type=\"{}\" message=\"{}\">{}</failure>\n    </testcase>\n",
                             c.verdict == "STALE" ? "stale" : "mismatch", xml_escape(c.verdict + ": " + c.detail.substr(0, 300)),
                             xml_escape(c.detail));
        else
            x += "/>\n";
    }
    x += "  </testsuite>\n</testsuites>\n";
    write_file_atomic(path, x, true);
}

}  // namespace ptool::cli
