"""verify's outputs for people and CI: --junit for any verify, --strict, --csv, --report (HTML).

    python3 tests/reports.py PTOOL ROOT"""
import csv
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()
M, P = f"{ROOT}/models/mlp_stacked.yaml", f"{ROOT}/plans/mlp_stacked_multi_wildcard.yaml"
FAULT = {"PTOOL_FAULT": "skip_all_reduce:layers.0.net2"}


def verify(*args, env=None):
    p = subprocess.run([PTOOL, "verify", *args], capture_output=True, text=True, timeout=300, env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


with tempfile.TemporaryDirectory() as tmp:
    out = {k: os.path.join(tmp, f"r.{k}") for k in ("xml", "csv", "html")}
    # a passing and a failing verify of the same plan
    for failing in (False, True):
        rc, text = verify(M, P, "--steps", "2", "-q", "--junit", out["xml"], "--csv", out["csv"], "--report", out["html"],
                          env=FAULT if failing else None)
        what = "failing" if failing else "passing"
        check(rc == (1 if failing else 0), f"{what}: exit {rc}\n{text}")
        m = re.search(r"(PASS|FAIL) (\d+)/(\d+) tensors agree", text)
        failed = int(m.group(3)) - int(m.group(2)) if m else -1
        # JUnit: a testcase for the plan and one per failing tensor
        x = subprocess.run(["xmllint", "--noout", "--schema", f"{ROOT}/tests/data/junit.xsd", out["xml"]], capture_output=True, text=True)
        check(x.returncode == 0, f"{what} junit does not validate against tests/data/junit.xsd: {x.stderr}")
        root = ET.parse(out["xml"]).getroot()
        cases = root.findall(".//testcase")
        failures = [c for c in cases if c.find("failure") is not None]
        check(len(cases) == 1 + failed and len(failures) == failed + failing,
              f"{what} junit: {len(cases)} testcases, {len(failures)} failures for {failed} failing tensors")
        check(root.get("tests") == str(len(cases)) and root.get("failures") == str(len(failures)), f"{what} junit totals")
        if failing:
            plan_case = cases[0].find("failure")
            check("first divergence: step 0 forward `layers.0.net2` output" in plan_case.get("message"),
                  f"junit plan message: {plan_case.get('message')}")
            names = {c.get("name") for c in failures}
            check("step0.grad.layers.0.net1.weight" in names, f"junit names the failing gradient: {sorted(names)[:5]}")
        # CSV: per step, each module's forward/backward and every compared tensor
        rows = list(csv.DictReader(open(out["csv"])))
        kinds = {r["kind"] for r in rows}
        check({"forward", "backward", "grad", "param", "output", "loss"} <= kinds, f"{what} csv kinds {kinds}")
        check({r["step"] for r in rows} == {"0", "1"}, f"{what} csv steps")
        bad = [r for r in rows if r["pass"] == "0"]
        check(bool(bad) == failing and all(float(r["headroom"]) >= 1 for r in bad if r["headroom"] not in ("inf", "nan")),
              f"{what} csv: {len(bad)} failing rows")
        tensors = [r for r in rows if r["tensor"]]
        check(len(tensors) == int(m.group(3)) if m else False, f"{what} csv: {len(tensors)} tensor rows, report says {m.group(3) if m else '?'}")
        if failing:
            first = next(r for r in rows if r["pass"] == "0")
            check(first["kind"] == "forward" and first["module"] == "layers.0.net2", f"csv's first failing row {first}")
        # HTML: self-contained, the heat map, the divergence marked once
        page = open(out["html"]).read()
        check("<script" not in page.lower() and not re.search(r"(src|href)\s*=", page, re.I), f"{what} html is not self-contained")
        check(page.count("<svg") == 2 and P.split("/")[-1] in page and "Collectives per module" in page and "rank 3" in page,
              f"{what} html: heat map and mesh")
        check(page.count("FIRST DIVERGENCE") == (1 if failing else 0), f"{what} html marks the divergence")
        check(("class=\"fail\"" in page) == failing, f"{what} html verdict")
    # --strict: warnings are failures
    for plan, warning in ((f"{ROOT}/plans/mlp_no_match.yaml", "matched no module"), (f"{ROOT}/plans/empty_plan.yaml", "empty")):
        model = f"{ROOT}/models/mlp.yaml"
        rc, text = verify(model, plan, "-q")
        check(rc == 0 and warning in text, f"{plan} without --strict: exit {rc}\n{text}")
        rc, text = verify(model, plan, "-q", "--strict", "--junit", out["xml"])
        check(rc == 1 and "FAIL under --strict" in text, f"{plan} --strict: exit {rc}\n{text}")
        check(ET.parse(out["xml"]).getroot().get("failures") == "1", f"{plan} --strict junit")
    # golden replays take --junit, not --csv/--report/--strict
    rc, text = verify(f"{ROOT}/golden/mlp_root_module.safetensors", "--report", out["html"])
    check(rc == 2 and "--report apply to" in text, f"golden --report: {rc}\n{text}")
# live progress: phases on stderr, a line per step with -v (stderr is no terminal here), their
# times adding up to the wall time; none with -q
p = subprocess.run([PTOOL, "verify", M, P, "--steps", "2", "-v"], capture_output=True, text=True, timeout=300)
m = re.search(r"phases: (.*) = ([0-9.]+) s; wall ([0-9.]+) s", p.stderr)
# (the reference runs beside the parallel run on a CPU with room for both: one phase for the two)
check(p.returncode == 0 and m and "parallel step 2/2" in p.stderr and "reference" in m.group(1) and "parallel" in m.group(1)
      and "report" in m.group(1),
      f"-v progress:\n{p.stderr}")
if m:
    parts = sum(float(x) for x in re.findall(r" ([0-9.]+) s", m.group(1)))
    check(abs(parts - float(m.group(2))) <= 0.01 * len(m.group(1).split(",")) and abs(float(m.group(2)) - float(m.group(3))) <= 0.02,
          f"phase times {parts} / {m.group(2)} vs wall {m.group(3)}")
# --reference-first: the reference's own phase and step lines, then the parallel run's
p = subprocess.run([PTOOL, "verify", M, P, "--steps", "2", "-v", "--reference-first"], capture_output=True, text=True, timeout=300)
check(p.returncode == 0 and "reference step 2/2" in p.stderr and "parallel step 2/2" in p.stderr
      and "reference + parallel" not in p.stderr, f"--reference-first progress:\n{p.stderr}")
p = subprocess.run([PTOOL, "verify", M, P], capture_output=True, text=True, timeout=300)
check("phases:" in p.stderr and re.search(r"reference[^:\n]*: 2 steps", p.stderr) and "step 1/2" not in p.stderr,
      f"by default: phases, no step lines (not a terminal):\n{p.stderr}")
p = subprocess.run([PTOOL, "verify", M, P, "-q"], capture_output=True, text=True, timeout=300)
check("phases:" not in p.stderr and "[" not in p.stderr, f"-q prints no progress:\n{p.stderr}")
check.finish()
