#!/usr/bin/env python3
"""End-to-end float8 cases of `ptool verify` and `ptool explain`, run by ctest.

    float8_cases.py PTOOL ROOT

Every plan under tests/data/float8/ (torchao's tensorwise Float8Linear under FSDP x TP+SP and
CP x TP) passes against the one-device reference in rank threads and under mpirun, with the same
per-tensor verdicts; explain --json lists the linears it converts (every one with dims of 16 but the
output head) and its text says so; explain's predicted peak of every rank is verify's measured one
to the byte; without the amax reductions (float8_local_amax on every
converted linear at once) the same plans fail; a bfloat16-compute float8 plan is refused by verify
(exit 2 at the float8 key: its verdict bounds are not derived) and explained; a bad section is exit
2 with file:line:column. The fault classes' detection and localisation per linear are the mutation
score's (tests/mutation_score.py).
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()
PLANS = sorted(glob.glob(f"{ROOT}/tests/data/float8/*.yaml"))
MODEL = f"{ROOT}/models/llama_rope.yaml"


def run(*args, env=None, mpi=0):
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(mpi)] if mpi else []
    p = subprocess.run(cmd + [PTOOL, *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def verify(plan, env=None, mpi=0, peaks=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        rc, text = run("verify", MODEL, plan, "--json", out, "-q", env=env, mpi=mpi)
        doc = json.load(open(out))["plans"][0] if os.path.exists(out) else {"tensors": [], "memory": []}
        if peaks is not None:
            peaks.update({m["rank"]: m["measured_peak_bytes"] for m in doc["memory"]})
        return rc, text, {t["name"]: t["pass"] for t in doc["tensors"]}


check(len(PLANS) >= 2, f"tests/data/float8 has {len(PLANS)} plans")
has_mpi = subprocess.run(["which", "mpirun"], capture_output=True).returncode == 0
for plan in PLANS:
    name = os.path.basename(plan)
    measured = {}
    rc, out, threads = verify(plan, peaks=measured)
    check(rc == 0 and len(threads) > 100 and all(threads.values()), f"{name}: threads exit {rc}\n{out[-2000:]}")
    if has_mpi:
        rc, out, procs = verify(plan, mpi=4)
        check(rc == 0 and procs == threads, f"{name}: mpirun exit {rc}, verdicts as the threads' {procs == threads}\n{out[-2000:]}")
    with tempfile.TemporaryDirectory() as tmp:
        ej = os.path.join(tmp, "e.json")
        rc, out = run("explain", MODEL, plan, "--json", ej)
        doc = json.load(open(ej)) if rc == 0 else {"float8": {"linears": []}, "memory": []}
        linears = doc["float8"]["linears"]
        # explain's simulation holds what the run holds, the emulation's float32 casts included
        predicted = {r: m["predicted_peak_bytes"] for m in doc["memory"] for r in m["ranks"]}
    check(predicted == measured and measured, f"{name}: explain predicts {predicted}, verify measured {measured}")
    check(len(linears) == 14 and "output" not in linears and all(l.endswith("_proj") for l in linears),
          f"{name}: explain's float8 linears {linears}")
    check("float8 tensorwise on 14 linears" in out, f"{name}: explain's text does not say float8\n{out[:800]}")
    # every scale from its own piece: the plan fails (the classes one linear at a time: mutation score)
    rc, out, _ = verify(plan, env={"PTOOL_FAULT": "float8_local_amax:*"})
    check(rc == 1 and "first divergence: step 0 forward" in out, f"{name}: local amax on every linear: exit {rc}\n{out[-1500:]}")

with tempfile.TemporaryDirectory() as tmp:
    bf16 = os.path.join(tmp, "bf16.yaml")
    text = open(f"{ROOT}/tests/data/float8/llama_rope_fsdp_tp_float8.yaml").read().replace("  mode: fully_shard\n",
                                         "  mode: fully_shard\n  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}\n")
    open(bf16, "w").write(text)
    line = text.splitlines().index("float8: {recipe: tensorwise}") + 1
    rc, out = run("verify", MODEL, bf16)
    check(rc == 2 and f"bf16.yaml:{line}:9: float8 with bfloat16 compute" in out, f"bf16 float8 verify: exit {rc}\n{out[-800:]}")
    rc, out = run("explain", MODEL, bf16)
    check(rc == 0 and "as bfloat16 GEMMs" in out, f"bf16 float8 explain: exit {rc}\n{out[-800:]}")
    bad = os.path.join(tmp, "bad.yaml")
    open(bad, "w").write("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp}\nfloat8: {recipe: tensorwise, filter_fqns: [proj, output]}\n")
    rc, out = run("verify", MODEL, bad)
    check(rc == 2 and "bad.yaml:3:9: float8: no linear of the model is converted" in out, f"float8 converting nothing: exit {rc}\n{out}")

check.finish()
