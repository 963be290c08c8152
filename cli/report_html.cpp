// verify --report FILE.html: one self-contained page (inline CSS and SVG, no script, no network)
// per verify: for each plan its summary, a heat map of error headroom per module x step (forward
// output, input gradient, parameter gradients, updates) with the first divergence marked, the
// collectives per module, and the mesh. Hovering a cell shows its numbers (SVG <title>).
// verify --csv FILE: the heat map's numbers, one row per tensor compared.
#include <cmath>
#include <map>

#include "cli/verify_output.h"
#include "core/files.h"

namespace ptool::cli {
namespace {

std::string esc(const std::string& s) {
    return markup_escape(s);
}

// The heat map's columns per step: a module's forward output, its input gradient, its parameters'
// gradients and their updates.
constexpr const char* kColumns[] = {"forward", "backward", "grad", "update"};
int column_of(const std::string& kind) {
    if (kind == "forward" || kind == "output" || kind == "loss") return 0;
    if (kind == "backward") return 1;
    if (kind == "grad" || kind == "grad_norm") return 2;
    return 3;  // param (the update), buffer
}

const char* colour(bool pass, double headroom) {
    if (!pass) return "#d73027";
    if (!(headroom < 0.01)) return headroom < 0.1 ? "#91cf60" : headroom < 0.5 ? "#d9ef8b" : "#fee08b";
    return "#1a9850";
}

struct Cell {
    bool pass = true;
    double headroom = 0;
    std::string tip;
};

std::string heat_map(const PlanReport& p) {
    const std::vector<ErrorCell> cells = error_cells(p);
    std::vector<std::string> rows;  // modules in the order they first show up
    std::map<std::string, int> row_of;
    int64_t steps = 0;
    std::map<std::tuple<int, int64_t, int>, Cell> grid;
    for (const ErrorCell& c : cells) {
        const std::string row = c.kind == "output" || c.kind == "loss" || c.kind == "grad_norm"
                                    ? "(model output, loss, grad norm)"
                                : c.module.empty() ? "(root)"
                                                   : c.module;
        if (!row_of.count(row)) row_of[row] = static_cast<int>(rows.size()), rows.push_back(row);
        steps = std::max(steps, c.step + 1);
        Cell& g = grid[{row_of[row], c.step, column_of(c.kind)}];
        const double h = c.pass || std::isfinite(c.diff.headroom) ? c.diff.headroom : 1e9;
        g.pass = g.pass && c.pass;
        g.headroom = std::max(g.headroom, h);
        g.tip += fmt::format(
            "{}step {} {} {}: max abs {}, max rel {}, headroom {}, {}\n", g.tip.empty() ? "" : "", c.step,
            c.kind,
            c.tensor.empty() ? "`" + (c.module.empty() ? std::string("(root)") : c.module) + "`" : c.tensor,
            markup_number(c.diff.max_abs), markup_number(c.diff.max_rel), markup_number(c.diff.headroom),
            c.pass ? "ok" : "FAIL");
    }
    if (rows.empty()) return "<p>No per-module numbers (run with localisation events on).</p>\n";
    std::optional<std::tuple<int, int64_t, int>> mark;
    if (p.divergence) {
        const Divergence& d = *p.divergence;
        std::string row = d.kind == "grad_norm" ? "(model output, loss, grad norm)" : d.fqn;
        if (d.kind == "grad" || d.kind == "param")
            row = d.fqn.rfind('.') == std::string::npos ? "(root)" : d.fqn.substr(0, d.fqn.rfind('.'));
        if (row.empty()) row = "(root)";
        if (row_of.count(row)) mark = std::make_tuple(row_of[row], d.step, column_of(d.kind));
    }
    size_t label = 0;
    for (const auto& r : rows) label = std::max(label, r.size());
    const int cw = 16, ch = 16, left = static_cast<int>(label) * 7 + 12, top = 46;
    const int width = left + static_cast<int>(steps) * (4 * cw + 8) + 10,
              height = top + static_cast<int>(rows.size()) * ch + 10;
    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" "
        "font-size=\"11\">\n",
        width, height);
    for (int64_t st = 0; st < steps; ++st) {
        const int x0 = left + static_cast<int>(st) * (4 * cw + 8);
        s += fmt::format("<text x=\"{}\" y=\"12\">step {}</text>\n", x0, st);
        for (int c = 0; c < 4; ++c)
            s += fmt::format(
                "<text x=\"{}\" y=\"{}\" transform=\"rotate(-60 {} {})\" font-size=\"9\">{}</text>\n",
                x0 + c * cw + 4, top - 3, x0 + c * cw + 4, top - 3, kColumns[c]);
    }
    for (size_t r = 0; r < rows.size(); ++r) {
        const int y = top + static_cast<int>(r) * ch;
        s += fmt::format("<text x=\"2\" y=\"{}\">{}</text>\n", y + 12, esc(rows[r]));
        for (int64_t st = 0; st < steps; ++st)
            for (int c = 0; c < 4; ++c) {
                const int x = left + static_cast<int>(st) * (4 * cw + 8) + c * cw;
                auto it = grid.find({static_cast<int>(r), st, c});
                if (it == grid.end()) {
                    s +=
                        fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#eeeeee\"/>\n",
                                    x, y, cw - 2, ch - 2);
                    continue;
                }
                const bool here = mark && *mark == std::make_tuple(static_cast<int>(r), st, c);
                s += fmt::format(
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
                    "fill=\"{}\"{}><title>{}{}</title></rect>\n",
                    x, y, cw - 2, ch - 2, colour(it->second.pass, it->second.headroom),
                    here ? " stroke=\"#000\" stroke-width=\"3\"" : "", here ? "FIRST DIVERGENCE\n" : "",
                    esc(it->second.tip));
                if (here)
                    s += fmt::format("<text x=\"{}\" y=\"{}\" font-weight=\"bold\">&#215;</text>\n", x + 3,
                                     y + 11);
            }
    }
    return s + "</svg>\n";
}

std::string mesh_svg(const PlanReport& p) {
    if (p.mesh.empty()) return "";
    const int rows = p.mesh.size() > 1 ? p.mesh[0].second : 1;
    const int cols = p.run.world_size / std::max(1, rows);
    const int w = 44, h = 26;
    std::string names;
    for (const auto& [n, size] : p.mesh) names += fmt::format("{}{}={}", names.empty() ? "" : " x ", n, size);
    std::string s = fmt::format(
        "<p>mesh {} ({} ranks, row-major: rank = coordinates in order){}</p>\n", esc(names), p.run.world_size,
        p.mesh.size() > 1 ? fmt::format("; rows are '{}'", esc(p.mesh[0].first)) : "");
    s += fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" "
        "font-size=\"11\">\n",
        cols * (w + 4) + 4, rows * (h + 4) + 4);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
            s += fmt::format(
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#deebf7\" stroke=\"#3182bd\"/>"
                "<text x=\"{}\" y=\"{}\">rank {}</text>\n",
                2 + c * (w + 4), 2 + r * (h + 4), w, h, 5 + c * (w + 4), 18 + r * (h + 4), r * cols + c);
    return s + "</svg>\n";
}

std::string collectives_table(const PlanReport& p) {
    const int64_t steps = std::max<int64_t>(1, static_cast<int64_t>(p.run.steps.size()));
    std::string s =
        "<table><tr><th>module</th><th>collective</th><th>mesh dim</th><th>calls / step</th><th>bytes / "
        "step</th></tr>\n";
    bool any = false;
    for (const auto& [key, t] : p.run.step_counts.entries()) {
        any = true;
        s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                         esc(std::get<2>(key).empty() ? "(root)" : std::get<2>(key)),
                         esc(collective_name(std::get<0>(key))), esc(std::get<1>(key)), t.calls / steps,
                         format_bytes(t.bytes / steps));
    }
    return any ? s + "</table>\n" : "<p>No collectives in the training steps.</p>\n";
}

}  // namespace

void write_html_report(const VerifyReport& report, const std::string& model_path, const std::string& path) {
    std::string h =
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ptool verify " +
        esc(model_path) +
        "</"
        "title>\n<style>body{font-family:sans-serif;margin:1.5em;max-width:80em}table{border-collapse:"
        "collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;font-family:monospace;font-size:12px}"
        ".pass{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}.legend "
        "span{display:inline-block;"
        "width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}</style></head><body>\n";
    h += fmt::format("<h1>ptool verify {}</h1>\n<p>{}: {} plan{}, reference {:.2f} ms. ptool {}</p>\n",
                     esc(model_path),
                     report.pass ? "<span class=\"pass\">PASS</span>" : "<span class=\"fail\">FAIL</span>",
                     report.plans.size(), report.plans.size() == 1 ? "" : "s", report.reference_seconds * 1e3,
                     PTOOL_VERSION);
    for (const PlanReport& p : report.plans) {
        const int64_t steps = std::max<int64_t>(1, static_cast<int64_t>(p.run.steps.size()));
        h += fmt::format("<h2>{} <span class=\"{}\">{}</span></h2>\n", esc(p.plan_path),
                         p.pass ? "pass" : "fail", p.pass ? "PASS" : "FAIL");
        h += fmt::format(
            "<p>{}/{} tensors agree; {} ranks ({}), {} step{}; rtol {:g} atol {:g}; parallel {:.2f} "
            "ms.</p>\n",
            p.passed, p.passed + p.failed, p.run.world_size, esc(p.run.backend), steps, steps == 1 ? "" : "s",
            p.tol.rtol, p.tol.atol, p.run.seconds * 1e3);
        if (!p.localisation.empty()) h += "<p><b>" + esc(p.localisation) + "</b></p>\n";
        for (const std::string& w : p.warnings) h += "<p>warning: " + esc(w) + "</p>\n";
        if (!p.notes.empty()) {
            h += "<ul>";
            for (const std::string& n : p.notes) h += "<li>" + esc(n) + "</li>";
            h += "</ul>\n";
        }
        h += "<h3>Error headroom per module and step</h3>\n<p class=\"legend\">headroom = worst |a - e| / "
             "(atol + rtol |e|):"
             "<span style=\"background:#1a9850\"></span>&lt; 0.01<span "
             "style=\"background:#91cf60\"></span>&lt; 0.1"
             "<span style=\"background:#d9ef8b\"></span>&lt; 0.5<span "
             "style=\"background:#fee08b\"></span>&lt; 1 (passes)"
             "<span style=\"background:#d73027\"></span>fails<span style=\"background:#eeeeee\"></span>not "
             "compared; "
             "&#215; the first divergence. Hover a cell for its tensors.</p>\n";
        h += heat_map(p);
        h += "<h3>Collectives per module</h3>\n" + collectives_table(p);
        h += "<h3>Mesh</h3>\n" + mesh_svg(p);
    }
    write_file(path, h + "</body></html>\n", true);
}

void write_csv_report(const VerifyReport& report, const std::string& path) {
    std::string s = "plan,step,kind,module,tensor,max_abs,max_rel,ulp,headroom,pass\n";
    auto field = [](const std::string& v) {  // RFC 4180 quoting
        if (v.find_first_of(",\"\n") == std::string::npos) return v;
        std::string q = "\"";
        for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
        return q + "\"";
    };
    auto n = [](double v) {
        return std::isfinite(v) ? fmt::format("{:.9g}", v) : std::string(std::isnan(v) ? "nan" : "inf");
    };
    for (const PlanReport& p : report.plans)
        for (const ErrorCell& c : error_cells(p))
            s += fmt::format("{},{},{},{},{},{},{},{},{},{}\n", field(p.plan_path), c.step, c.kind,
                             field(c.module), field(c.tensor), n(c.diff.max_abs), n(c.diff.max_rel),
                             c.diff.max_ulp, n(c.diff.headroom), c.pass ? 1 : 0);
    write_file(path, s, true);
}

}  // namespace ptool::cli
