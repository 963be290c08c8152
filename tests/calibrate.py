#!/usr/bin/env python3
"""`ptool calibrate` (plan/calibrate.h, docs/kernel_table.md): the table it writes, the cluster that
names it, and its fallbacks.

  calibrate.py PTOOL ROOT

- `--device cpu` writes a table of the shipped schema (docs/schema/kernel_table.schema.json): the
  three GEMMs of a linear, attention rows, `copy` and the upcast loss, every time positive;
- a cluster naming that table prices explain from it and says so (measured); one whose peaks
  differ says the table is scaled (derived), by the ratio of peaks;
- `--device cuda` without a GPU exits 3 naming why and writes nothing (with a GPU: the table, the
  same schema; in a build without the CUDA backend, exit 2 saying so);
- an output path in no directory: exit 2, nothing written; a table without `copy`: the cluster
  that names it is refused, exit 2 at file:line:column;
- the shipped H100 table passes the same schema.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402
from json_schema import validate  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()


def run(*args):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def table_checks(path, what):
    t = json.load(open(path))
    err = validate(t, "kernel_table")
    check(err is None, f"{what}: the table fails its schema: {err}")
    ops = {g["op"] for g in t.get("gemm", [])}
    check(ops == {"fwd", "dgrad", "wgrad"}, f"{what}: GEMM ops {sorted(ops)}, not a linear's three")
    check(all(g["seconds"] > 0 for g in t.get("gemm", [])) and len(t.get("gemm", [])) >= 6,
          f"{what}: {len(t.get('gemm', []))} GEMM rows, or a non-positive time")
    mem = {m["op"] for m in t.get("memory", [])}
    check({"copy", "cross_entropy"} <= mem, f"{what}: memory ops {sorted(mem)} lack copy or the loss")
    check(len(t.get("attention", [])) >= 1 and all(a["fwd_bwd_seconds"] > a["fwd_seconds"] > 0
                                                   for a in t["attention"]),
          f"{what}: attention rows {t.get('attention')}")
    return t


def explain_source(cluster):
    rc, out = run("explain", f"{ROOT}/models/llama_rope.yaml", f"{ROOT}/plans/llama_rope_fsdp_tp_ac.yaml",
                  "--cluster", cluster)
    m = re.search(r"compute, term by term \((measured|derived): ([^\n]*)", out)
    return rc, out, m


with tempfile.TemporaryDirectory() as tmp:
    table = os.path.join(tmp, "cpu.json")
    rc, out = run("calibrate", "--device", "cpu", "-o", table)
    if check(rc == 0 and os.path.exists(table), f"calibrate --device cpu: exit {rc}\n{out}"):
        t = table_checks(table, "calibrate --device cpu")
        check(t["peak"]["tflops"].get("float32", 0) > 0, f"no float32 peak: {t['peak']}")
        # a cluster that names it: explain prices from it and names it
        base = open(f"{ROOT}/clusters/cpu_local.yaml").read()
        cluster = os.path.join(tmp, "local.yaml")
        peak = t["peak"]["tflops"]["float32"]
        bw = t["peak"]["memory_bandwidth_gb_s"]
        same = re.sub(r"tflops: \{[^}]*\}", f"tflops: {{float32: {peak!r}}}", base)
        same = re.sub(r"memory_bandwidth_gb_s: [0-9.]+", f"memory_bandwidth_gb_s: {bw!r}", same)
        open(cluster, "w").write(same + "kernels: cpu.json\n")
        rc, out, m = explain_source(cluster)
        check(rc == 0 and m is not None and m.group(1) == "measured" and "cpu.json" in m.group(2),
              f"explain on a cluster naming the calibrated table: exit {rc}, source {m and m.group(0)}\n{out[-2000:]}")
        rc, ms_measured = rc, re.search(r"^    GEMMs +([\d.]+) ms", out, re.M)
        # twice the peaks: the table's times scaled, and explain says derived
        double = re.sub(r"tflops: \{float32: [^}]*\}", f"tflops: {{float32: {2 * peak!r}}}", same)
        double = re.sub(r"memory_bandwidth_gb_s: [0-9.e+-]+", f"memory_bandwidth_gb_s: {2 * bw!r}", double)
        open(cluster, "w").write(double + "kernels: cpu.json\n")
        rc, out, m = explain_source(cluster)
        check(rc == 0 and m is not None and m.group(1) == "derived" and "float32 x2.000" in m.group(2)
              and "memory x2.000" in m.group(2),
              f"explain on a cluster with twice the table's peaks: exit {rc}, source {m and m.group(0)}")
        ms_derived = re.search(r"^    GEMMs +([\d.]+) ms", out, re.M)
        if check(ms_measured and ms_derived, "explain prints no GEMMs term"):
            a, b = float(ms_measured.group(1)), float(ms_derived.group(1))
            check(abs(b - a / 2) <= 0.06 * a / 2 + 0.05, f"GEMMs at twice the peak: {b} ms, measured {a} ms")
        # a table without copy is refused where the cluster names it
        bad = dict(t, memory=[m for m in t["memory"] if m["op"] != "copy"])
        open(os.path.join(tmp, "bad.json"), "w").write(json.dumps(bad, indent=1))
        open(cluster, "w").write(same + "kernels: bad.json\n")
        rc, out, _ = explain_source(cluster)
        check(rc == 2 and re.search(r"bad\.json:\d+:\d+: .*copy", out) is not None,
              f"a table without copy: exit {rc}\n{out[-800:]}")

    # cuda: without a GPU exit 3 naming it, nothing written; with one, the table
    gpu_table = os.path.join(tmp, "cuda.json")
    rc, out = run("calibrate", "--device", "cuda", "-o", gpu_table)
    if rc == 0:
        table_checks(gpu_table, "calibrate --device cuda")
    elif "built without CUDA support" in out:  # a build without the CUDA backend (the sanitizer jobs'): usage, exit 2
        check(rc == 2 and not os.path.exists(gpu_table),
              f"calibrate --device cuda in a build without CUDA: exit {rc} (2 wanted), wrote {os.path.exists(gpu_table)}\n{out}")
        print(f"calibrate --device cuda (built without CUDA): exit 2: {out.strip().splitlines()[-1]}")
    else:
        check(rc == 3 and re.search(r"CUDA|GPU", out) is not None and not os.path.exists(gpu_table),
              f"calibrate --device cuda without a GPU: exit {rc} (3 wanted), wrote {os.path.exists(gpu_table)}\n{out}")
        print(f"calibrate --device cuda (no GPU here): exit 3: {out.strip().splitlines()[-1]}")

    nowhere = os.path.join(tmp, "no", "such", "dir", "k.json")
    rc, out = run("calibrate", "--device", "cpu", "-o", nowhere)
    check(rc == 2 and not os.path.exists(nowhere), f"-o in no directory: exit {rc}\n{out}")

shipped = f"{ROOT}/clusters/kernels/h100_sxm5_80gb.json"
err = validate(json.load(open(shipped)), "kernel_table")
check(err is None, f"{shipped}: {err}")
check.finish()
