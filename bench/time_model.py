#!/usr/bin/env python3
"""The time model against measured steps on this machine: for each case, the step time `ptool
explain --cluster clusters/cpu_local.yaml` predicts (4 rank threads sharing the machine's measured
sgemm, memcpy and all_reduce rates) and the step time `ptool verify --json` measures for the
parallel run (forward + backward + gradient sync + optimizer, per step, best of REPEATS runs).

    bench/time_model.py [PTOOL] [REPEATS]        default build/cli/ptool, 3

Prints predicted / measured per case. A calibration report, not a gate: the cluster file's rates
were measured with bench_run and bench_comm; docs/planning.md quotes a run of this script.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTOOL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build/cli/ptool")
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CASES = [  # model, plan, mesh overrides (4 ranks: the cluster file's share of the machine)
    ("models/gemm_mlp.yaml", "plans/gemm_mlp_tp.yaml", ["tp=4"]),
    ("models/gemm_mlp.yaml", "plans/gemm_mlp_ddp.yaml", ["dp=4"]),
    ("models/llama_rope.yaml", "plans/llama_rope_fsdp_tp_ac.yaml", []),
    ("models/llama_rope.yaml", "plans/llama_rope_ddp_tp_bf16.yaml", []),
    ("models/mlp_stacked_mse.yaml", "plans/mlp_stacked_dp2_tp2.yaml", []),
]

print(f"{'case':<45} {'predicted':>10} {'measured':>10} {'ratio':>6}")
with tempfile.TemporaryDirectory() as tmp:
    ej, vj = os.path.join(tmp, "e.json"), os.path.join(tmp, "v.json")
    for model, plan, mesh in CASES:
        flags = [x for m in mesh for x in ("--mesh", m)]
        subprocess.run([PTOOL, "explain", model, plan, "--cluster", "clusters/cpu_local.yaml", "--json", ej, *flags],
                       cwd=ROOT, check=True, capture_output=True)
        e = json.load(open(ej))
        predicted = max(t["step_seconds"] for t in e["time"])
        measured = 1e30
        for _ in range(REPEATS):
            subprocess.run([PTOOL, "verify", model, plan, "--json", vj, "-q", *flags], cwd=ROOT, capture_output=True)
            measured = min(measured, json.load(open(vj))["plans"][0]["seconds"] / e["verify_steps"])
        name = os.path.basename(plan)[:-5] + (f" ({', '.join(mesh)})" if mesh else "")
        print(f"{name:<45} {predicted * 1e3:8.2f} ms {measured * 1e3:8.2f} ms {predicted / measured:6.2f}")
