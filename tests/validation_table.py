#!/usr/bin/env python3
"""ptool's step time against published, measured training runs (bench/validation/runs.yaml).

For each run: `ptool explain MODEL PLAN --cluster C --json`; the predicted step is the slowest rank
class's; the published step is the run's tokens per step / (tokens/s/GPU x GPUs). The error is
predicted / published - 1. A cluster that names a kernel table (`kernels:`, docs/kernel_table.md)
prices its GEMMs from that measured table and has no gemm_efficiency: no row is fitted to, and
every row counts in the summary; a `calibration: true` row sets gemm_efficiency only for a cluster
without a table (the roofline).

  validation_table.py PTOOL ROOT            check docs/planning.md's table equals this run's, and
                                            each calibration row is reproduced within 0.5%
  validation_table.py PTOOL ROOT --table    print the table (for docs/planning.md)
  validation_table.py PTOOL ROOT --calibrate GPU
                                            the gemm_efficiency that makes GPU's calibration row exact
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402


def load(root):
    return yaml.safe_load(open(os.path.join(root, "bench/validation/runs.yaml")))["runs"]


def tokens_per_step(root, run):
    m = yaml.safe_load(open(os.path.join(root, "bench/validation/models", run["model"] + ".yaml")))
    rows, seq = m["batch"]["input"]["tokens"]
    return rows * seq


def predicted(ptool, root, run, cluster=None, tmp=None):
    with tempfile.TemporaryDirectory() as own:
        out = os.path.join(tmp or own, "explain.json")
        cmd = [ptool, "explain", os.path.join(root, "bench/validation/models", run["model"] + ".yaml"),
               os.path.join(root, "bench/validation/plans", run["plan"] + ".yaml"),
               "--cluster", cluster or os.path.join(root, run["cluster"]), "--json", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{run['id']}: {' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
        j = json.load(open(out))
        return max(t["step_seconds"] for t in j["time"])


def fitted(root, run):
    """Whether the row sets its cluster's gemm_efficiency (a calibration row of a roofline cluster)."""
    if not run.get("calibration"):
        return False
    return yaml.safe_load(open(os.path.join(root, run["cluster"]))).get("kernels") is None


def rows(ptool, root):
    out = []
    for run in load(root):
        published = tokens_per_step(root, run) / (run["tokens_per_s_per_gpu"] * run["gpus"])
        pred = predicted(ptool, root, run)
        out.append((dict(run, calibration=fitted(root, run)), published, pred, pred / published - 1))
    return out


def table(result):
    lines = ["| run | GPUs | model | plan | published step | ptool | error |",
             "|---|---|---|---|---|---|---|"]
    for run, published, pred, err in result:
        mark = " (calibration)" if run.get("calibration") else ""
        lines.append(f"| {run['id']}{mark} | {run['gpus']} x {run['gpu'].upper()} | {run['model']} | {run['plan']} | "
                     f"{published:.3f} s | {pred:.3f} s | {100 * err:+.1f}% |")
    others = [abs(e) for run, _, _, e in result if not run.get("calibration")]
    besides = " besides the calibration rows" if len(others) < len(result) else ", none fitted to"
    lines.append("")
    lines.append(f"{len(others)} rows{besides}: mean |error| {100 * sum(others) / len(others):.1f}%, "
                 f"largest {100 * max(others):.1f}%, {sum(e > 0.10 for e in others)} over 10%.")
    for gpu in sorted({run["gpu"] for run, _, _, _ in result}):
        errs = [e for run, _, _, e in result if run["gpu"] == gpu and not run.get("calibration")]
        lines.append(f"- {gpu.upper()}: {len(errs)} rows, mean |error| {100 * sum(map(abs, errs)) / len(errs):.1f}%, "
                     f"mean error {100 * sum(errs) / len(errs):+.1f}%, from {100 * min(errs):+.1f}% to {100 * max(errs):+.1f}%")
    return lines


def calibrate(ptool, root, gpu):
    run = next(r for r in load(root) if r["gpu"] == gpu and r.get("calibration"))
    if not fitted(root, run):
        sys.exit(f"{run['cluster']} names a kernel table: its GEMMs are measured, it has no gemm_efficiency to solve")
    published = tokens_per_step(root, run) / (run["tokens_per_s_per_gpu"] * run["gpus"])
    text = open(os.path.join(root, run["cluster"])).read()
    lo, hi = 0.05, 1.0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cluster.yaml")
        for _ in range(30):
            mid = (lo + hi) / 2
            open(path, "w").write(re.sub(r"gemm_efficiency: [0-9.]+", f"gemm_efficiency: {mid:.6f}", text))
            if predicted(ptool, root, run, path) > published:
                lo = mid
            else:
                hi = mid
    return run, (lo + hi) / 2


def main():
    ptool, root = sys.argv[1], sys.argv[2]
    if "--calibrate" in sys.argv:
        run, eff = calibrate(ptool, root, sys.argv[sys.argv.index("--calibrate") + 1])
        print(f"{run['id']}: gemm_efficiency {eff:.4f}")
        return
    result = rows(ptool, root)
    lines = table(result)
    if "--table" in sys.argv:
        print("\n".join(lines))
        return
    check = Checks()
    docs = open(os.path.join(root, "docs/planning.md")).read()
    for line in lines:
        check(line in docs, f"docs/planning.md lacks the line (regenerate with --table):\n  {line}")
    for run, published, pred, err in result:
        if run.get("calibration"):
            check(abs(err) <= 0.005, f"{run['id']} is {run['gpu']}'s calibration row, off by {100 * err:+.2f}%")
    check(len(result) - sum(1 for r in result if r[0].get("calibration")) >= 10, "at least 10 rows besides calibration")
    check.finish()


if __name__ == "__main__":
    main()
