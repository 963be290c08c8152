#!/usr/bin/env python3
"""explain's prediction of training steps measured on GPUs (bench/validation/*/measured.yaml: an H100's
and an H200's).

For each run: `ptool import hf CONFIG --batch B --seq S`, `ptool explain MODEL PLAN --cluster C
--json`, and the measured steady state against the prediction (the issue's bounds, no per-run
constant anywhere):

  allocated (torch.cuda.max_memory_allocated)  within 3%
  reserved (torch.cuda.max_memory_reserved)    within 5%, and never low by more than 2% (unsafe)
  step seconds                                 within 5%
  on the device (total minus free)             never low by more than 2%

  gpu_anchor.py PTOOL ROOT             check (prints the table)
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402


def predict(ptool, root, here, run, tmp):
    model = os.path.join(tmp, run["id"] + ".yaml")
    p = subprocess.run([ptool, "import", "hf", os.path.join(here, run["config"]), "--batch", str(run["batch"]),
                        "--seq", str(run["seq"]), "-o", model], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{run['id']}: import hf: exit {p.returncode}\n{p.stdout}{p.stderr}")
    out = os.path.join(tmp, run["id"] + ".json")
    p = subprocess.run([ptool, "explain", model, os.path.join(here, run["plan"]), "--cluster",
                        os.path.join(root, run["cluster"]), "--json", out], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{run['id']}: explain: exit {p.returncode}\n{p.stdout}{p.stderr}")
    j = json.load(open(out))
    m, t = j["memory"][0], j["time"][0]
    return {"allocated_bytes": m["allocated_peak_bytes"], "reserved_bytes": m["predicted_reserved_peak_bytes"],
            "device_used_bytes": m["device_peak_bytes"], "seconds": t["step_seconds"],
            "first_allocated_bytes": m["first_step_allocated_peak_bytes"]}


def main():
    ptool, root = sys.argv[1], sys.argv[2]
    runs = [(os.path.dirname(f), run) for f in sorted(glob.glob(os.path.join(root, "bench/validation/*/measured.yaml")))
            for run in yaml.safe_load(open(f))["runs"]]
    check = Checks()
    gib = float(1 << 30)
    with tempfile.TemporaryDirectory() as tmp:
        print("| run | quantity | measured | ptool | error |\n|---|---|---|---|---|")
        check(len(runs) >= 7, f"{len(runs)} measured runs (an H100's and six H200's expected)")
        for here, run in runs:
            got = predict(ptool, root, here, run, tmp)
            want = run["steady"]
            for key, name, lo, hi in (("allocated_bytes", "allocated", -0.03, 0.03),
                                      ("reserved_bytes", "reserved", -0.02, 0.05),
                                      ("device_used_bytes", "on the device", -0.02, None),
                                      ("seconds", "step", -0.05, 0.05)):
                err = got[key] / want[key] - 1
                unit = (lambda v: f"{v * 1e3:.1f} ms") if key == "seconds" else (lambda v: f"{v / gib:.2f} GiB")
                print(f"| {run['id']} | {name} | {unit(want[key])} | {unit(got[key])} | {100 * err:+.1f}% |")
                check(err >= lo and (hi is None or err <= hi),
                      f"{run['id']}: {name} predicted {got[key]:.6g}, measured {want[key]:.6g}: {100 * err:+.2f}% "
                      f"outside [{100 * lo:+.0f}%, {'' if hi is None else f'{100 * hi:+.0f}%'}]")
            first = run.get("first_step", {}).get("allocated_bytes")
            if first:
                err = got["first_allocated_bytes"] / first - 1
                print(f"| {run['id']} | first step allocated | {first / gib:.2f} GiB | "
                      f"{got['first_allocated_bytes'] / gib:.2f} GiB | {100 * err:+.1f}% |")
                check(abs(err) <= 0.03, f"{run['id']}: first step's allocated {100 * err:+.2f}% off")
    check.finish()


if __name__ == "__main__":
    main()
